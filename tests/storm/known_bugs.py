"""Stickless bugs the randomized storms found, one switch each.

While a switch is True, exactly its symptom in a storm is listed as a known-bug hit instead of
failing the run, and its focused repro (tests/test_storm_findings.py) is marked
xfail(strict=True), so fixing the bug turns the repro into a pass. The fixed ones stay as
regression tests with their switch False; set one True only to diagnose a regression.
"""

from __future__ import annotations

#: (fixed) Between `LocalCluster.kill` severing a node's link and `SessionRouter.kill` failing
#: its waiters, the node's actors kept running, so a turn finishing in that window answered the
#: node's own callers -- with a TurnResult although `mark_done` failed and every other caller of
#: that turn was told HOLDER_LOST, or with FAILED("commit failed") -- instead of
#: RouterClosedError. While True, such answers are listed, and the checker does not trust
#: results handed out by a node being killed.
KILLED_NODE_ANSWERS_BUG = False
#: (fixed) A caller that attaches to an in-flight turn (same key, same input) waited under
#: fencing token 0, so any EVICT of the session, even a late one from an older lease, failed it
#: with EVICTED while the turn ran on and committed. While True, exactly that symptom (an
#: attached caller told EVICTED about a turn that was not evicted) is listed.
ATTACHED_EVICT_BUG = False
#: (fixed) When the inbox take's reply was lost (the server went down right after running it,
#: or the retry failed too), the batch it took was gone: the forwarded turn never ran and its
#: caller was answered by its forward deadline (FORWARD_TIMEOUT). A collect now moves entries
#: into a pending set that only an acknowledgement after the answer is recorded empties, and the
#: holder takes its own pending entries back after a failed collect.
LOST_COLLECT_BUG = False
#: (fixed) A submit refused with BackendUnavailableError ("nothing reserved") whose reservation
#: could not be discarded leaves the key reserved (holderless, IN_FLIGHT) for forward_ttl; the
#: client's retry with the same key attaches to a turn that was never queued and is answered
#: FORWARD_TIMEOUT or HOLDER_LOST after forward_ttl. When it is the stale-index write after
#: `put_if_absent` that failed, the reservation (held by the submitter) is missing from the
#: index: the holder-loss sweep never resets it, so whoever attached to it before it turned
#: stale gets FORWARD_TIMEOUT, and it stays IN_FLIGHT up to the primary TTL.
GHOST_RESERVATION_BUG = False
#: (fixed) When a live holder's reservation touches lag past the secondary TTL (a starved
#: renewal thread), another node's holder-loss sweep records the turn HOLDER_LOST; the holder's
#: turn still commits, its `mark_done` is refused, yet `SessionRouter.complete` answers its own
#: callers with the TurnResult -- contradicting the store (and the HOLDER_LOST its other callers
#: got), and letting a retry with the key run the turn again.
STALE_SUCCESS_BUG = False
#: (fixed) After its lease is dropped locally (a commit refused by fencing), the session actor
#: keeps draining its mailbox and answers every queued message LEASE_LOST without running it,
#: instead of handing it back to the inbox for the new holder.
FENCED_QUEUE_BUG = False
#: (fixed) A submit refused with BackendUnavailableError after its inbox entry was written (only
#: the pending-index write failed) leaves the message queued, unindexed and unannounced: it runs
#: whenever something else rings the session (or sits there forever).
REFUSED_BUT_QUEUED_BUG = False
#: OPEN (2026-12-03, no small repro yet): the same symptom as REFUSED_BUT_QUEUED_BUG by another
#: way: the fault storm with this stop's new faults (pub/sub-only and command-only cuts, the
#: command-path stall wave) saw once (seed 20250611, retry) a submit refused whose turn ran
#: anyway (s02/u21).
REFUSED_BUT_RAN_BUG = True
#: (fixed) A forward whose message reaches the inbox after the holder's release purged it
#: (between the purge and the EVICT) is failed by that EVICT with EVICTED, while the message
#: survives, runs under the next lease and commits.
LATE_DELIVERY_EVICT_BUG = False
#: (fixed) The fault storm's stream check (tests/storm/streams.py) saw, in 1 of its 6 CI runs, a
#: session stream resumed on another node that missed a turn's first frames, or yielded a turn
#: out of order, around a redis-server restart combined with node kills. A node handed its own
#: logged frames to its local streams directly: while its pub/sub was down, they moved a
#: stream's position past frames other nodes had logged before them, and the catch-up after
#: the resubscribe read the log past that position (repro:
#: tests/test_stream_catch_up.py::test_own_frames_do_not_carry_a_stream_past_frames_it_missed).
#: Own frames now reach local streams on the session's channel, in log order. Also, a gap a
#: node's stream met (a catch-up the log could not give in full) did not cross the node
#: protocol, so the storm saw a miss where the stream had reported one; it crosses now.
STREAM_COMPLETENESS_BUG = False
#: OPEN (2026-12-03, no small repro yet): the fault storm with this stop's new faults saw, once
#: (seed 240, fail), a forwarded caller answered FORWARD_TIMEOUT whose message never ran and that
#: no refused submit or failed collect explains (call #129 's01|u45|' via node-6, a Redis
#: restart 3.5 s before it was sent).
VANISHED_FORWARD_BUG = True
