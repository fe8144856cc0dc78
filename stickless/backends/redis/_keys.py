"""Every Redis key, channel and index member of one namespace, formatted in one place.

All keys of one session share the hash tag `{<ns>:s:<session_id>}`. The cluster-wide indexes
(stale reservations, pending sessions, dead letters, and the per-holder indexes of leases and
reservations) live outside any session's slot and are only written by single-key commands.
The liveness keys (`liveness`) also live outside: session scripts read the one of the holder
named in a lease or reservation, so the bundle needs one Redis server (or a primary with
replicas), not a Redis Cluster.

Dead letters are kept in the session's slot (`dead_letters`: a hash of letter id -> packed
letter, `base.pack_letter`), so a session script can add one atomically with what it records
(HSETNX, stamping `dead_at` in place with the prelude's `letter_stamp`). The namespace-wide
`dead_index` (members: letter ids, which name their session; scores: `dead_at`) is a superset
of the letters: whoever adds a letter puts its id there with score 0 in the same pipeline,
after the script, then (best effort) at its `dead_at`; readers settle score-0 members to the
letter's `dead_at` and drop members whose letter is gone.

How long each key lives (removed, expiring, or kept on purpose) is listed in the README section
"Redis memory and retention" and checked by `tests/test_redis_retention.py`.
"""

from __future__ import annotations

from ..._types import Priority

#: Inbox tiers in stream order: scripts receive one stream key per tier, NOW first.
TIERS: tuple[Priority, ...] = tuple(sorted(Priority))


def _check_name(what: str, value: str) -> str:
    """Refuse names that would break the hash tag (braces) or are empty."""
    if not value or "{" in value or "}" in value:
        raise ValueError(f"{what} must be non-empty and contain no braces: {value!r}")
    return value


class Keys:
    """Key formats of one namespace (the Redis key prefix)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = _check_name("namespace", namespace)
        #: Sorted set of IN_FLIGHT reservations scored by (a lower bound of) their stale deadline.
        self.stale_index = f"{namespace}:idx:stale"
        #: Sorted set of sessions with queued messages scored by (a lower bound of) the oldest
        #: arrival time.
        self.pending_index = f"{namespace}:idx:pending"
        #: Sorted set of dead-letter ids scored by `dead_at` (0: not settled yet); a superset
        #: of the letters, verified by readers (see the module docstring).
        self.dead_index = f"{namespace}:idx:dead"
        #: Sorted set of holders scored by their liveness deadline (0: due for the dead-holder
        #: sweep at once); a holder is dropped once the sweep has cleaned up after it.
        self.live_index = f"{namespace}:idx:live"
        #: Prefix of every holder's liveness key (scripts derive a holder's key from it).
        self.live_prefix = f"{namespace}:live:"
        #: Pub/sub channel shared by every node for all signal kinds but EVENT.
        self.control_channel = f"{namespace}:control"

    def tag(self, session_id: str) -> str:
        """The hash tag every key of the session starts with."""
        return f"{{{self.namespace}:s:{_check_name('session id', session_id)}}}"

    def lease(self, session_id: str) -> str:
        """Hash {holder, token, exp} of the session's lease."""
        return f"{self.tag(session_id)}:lease"

    def token_counter(self, session_id: str) -> str:
        """Fencing-token counter; outlives release and record delete, expiring `token_ttl`
        after the last lease it served (a missing counter restarts above the old tokens)."""
        return f"{self.tag(session_id)}:tokens"

    def record(self, session_id: str) -> str:
        """Hash {fence, agent (once bound)} of the session record."""
        return f"{self.tag(session_id)}:record"

    def transcript(self, session_id: str) -> str:
        """List of packed committed transcript entries."""
        return f"{self.tag(session_id)}:transcript"

    def inbox(self, session_id: str) -> list[str]:
        """One stream per priority tier, in `TIERS` order; each is deleted when collected and
        expires `inbox_ttl` after its last delivery."""
        tag = self.tag(session_id)
        return [f"{tag}:inbox:{int(priority)}" for priority in TIERS]

    def pending(self, session_id: str) -> list[str]:
        """The pending set of collected, unacknowledged entries: a sorted set of message ids
        scored by the lease token that holds them, and a hash of each one's packed {envelope,
        arrival, taken} (`taken`: when a collect last moved it under a token; absent from
        entries written before it existed); both expire `inbox_ttl` after their last write."""
        tag = self.tag(session_id)
        return [f"{tag}:pending:ids", f"{tag}:pending:entries"]

    def delivery(self, session_id: str, delivery_id: str) -> str:
        """String "stream id arrival" of one recent delivery (a rerun appends once); expires."""
        return f"{self.tag(session_id)}:delivery:{_check_name('delivery id', delivery_id)}"

    def take(self, session_id: str, take_id: str) -> str:
        """The reply of one inbox take, kept for a while (a rerun answers the same batch)."""
        return f"{self.tag(session_id)}:take:{_check_name('take id', take_id)}"

    def reservation(self, session_id: str, key: str) -> str:
        """Hash of one idempotency reservation (the key may hold any characters)."""
        return f"{self.tag(session_id)}:idem:{key}"

    def turn_index(self, session_id: str, turn_id: str) -> str:
        """String naming the reservation key a turn was reserved under (so a turn is found by
        its id); written with the reservation, expiring with its reserve-time TTL."""
        return f"{self.tag(session_id)}:turn:{turn_id}"

    def event_log(self, session_id: str) -> str:
        """Stream of the session's event frames (its max-deleted-entry-id is the newest dropped
        frame); expires `event_log_ttl` after its last append or delete."""
        return f"{self.tag(session_id)}:events"

    def relay_batches(self, session_id: str) -> str:
        """List of the session's newest relay batches, "<batch id> <event id> ...", newest
        first (`RELAY_BATCH_WINDOW` at most), so a relay call run again is answered, not
        repeated; expires with the event log."""
        return f"{self.tag(session_id)}:relay"

    def dead_letters(self, session_id: str) -> str:
        """Hash of the session's dead letters, letter id -> packed letter; kept until removed
        or purged (a delete of the session leaves it: letters are the operator's to clear)."""
        return f"{self.tag(session_id)}:dead"

    def owner(self, session_id: str) -> str:
        """String naming the principal that created the session (see `SessionOwners`); kept
        until the session is deleted through the gateway."""
        return f"{self.tag(session_id)}:owner"

    def chat_stream(self, session_id: str) -> str:
        """String naming the turn the session's chat client last started (see `ChatStreams`);
        expires `event_log_ttl` after it was set."""
        return f"{self.tag(session_id)}:chat"

    def event_channel(self, session_id: str) -> str:
        """Pub/sub channel of the session's EVENT signals (plain PUBLISH, slot-agnostic)."""
        return f"{self.namespace}:ev:{session_id}"

    def liveness(self, holder: str) -> str:
        """String naming the holder's live incarnation; expires unless renewed (see
        `Liveness`). Outside every session's slot: the session scripts read it by name."""
        return f"{self.live_prefix}{holder}"

    def holder_leases(self, holder: str) -> str:
        """Set of session ids whose lease `holder` may hold (a superset: members are verified
        against the lease hash before use, dead ones dropped); kept alive by the holder's
        liveness renewals, it expires `index ttl` after the last one."""
        return f"{self.namespace}:holder:{holder}:leases"

    def holder_reservations(self, holder: str) -> str:
        """Set of `reservation_member`s of IN_FLIGHT reservations `holder` may hold (a superset:
        members are verified against the reservation hash before use, dead ones dropped);
        kept alive by the holder's liveness renewals, it expires `index ttl` after the last
        one (or twice the staleness TTL after its last write, whichever is later)."""
        return f"{self.namespace}:holder:{holder}:idem"


def reservation_member(session_id: str, key: str, turn_id: str) -> str:
    """Stale-index (and holder-index) member of one reservation instance; the turn id makes a
    retry a new member."""
    return f"{len(session_id)}:{session_id}{len(key)}:{key}{turn_id}"


def parse_reservation_member(member: str) -> tuple[str, str, str]:
    """(session id, key, turn id) of a stale-index member.

    Raises:
        ValueError: the member is not of the `reservation_member` form.
    """
    fields: list[str] = []
    rest = member
    for _ in range(2):
        size, sep, rest = rest.partition(":")
        if not sep or not size.isdigit() or int(size) > len(rest):
            raise ValueError(f"malformed index member {member!r}")
        fields.append(rest[: int(size)])
        rest = rest[int(size) :]
    return fields[0], fields[1], rest
