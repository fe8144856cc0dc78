-- KEYS: event stream, the session's recent relay batches (a list).
-- ARGV: bound, ttl (ms), batch window, batch id, event channel, signal head, ids head,
-- encoded frames...
-- One relay batch (see relay_batch): the same call run again (redis-py resends it after a lost
-- reply) appends and publishes nothing and answers the first run's ids.
-- Reply: the ids, in order.
return relay_batch(KEYS[1], KEYS[2], argv_slice(1, 7), argv_slice(8, #ARGV - 7))
