"""The Redis dead-letter store: one hash per session in its slot, and a namespace-wide index."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ..._logs import get_logger
from ...wire import WireError
from ..base import (
    DeadLetter,
    check_letter,
    letter_session,
    pack_letter,
    stamp_of,
    unpack_letter,
    unreadable_letter,
)
from ._role import _SCAN_BATCH, _SCAN_ROUNDS, _num, _Role, _text
from ._scripts import Call, run_batch

logger = get_logger(__name__)

#: Index score of a letter whose header is unreadable: listed last (oldest).
_UNKNOWN_STAMP = 1e-6

# (Aliases at module level: inside the store, `list` names its method.)
#: Index members with their scores.
_Members = list[tuple[str, float]]
#: Verified members: (letter id, session, the verifying command's reply).
_Kept = list[tuple[str, str, Any]]


def _scored(hits: Any) -> _Members:
    """A WITHSCORES reply as (member, score) pairs."""
    return [(_text(member), float(score)) for member, score in hits]


def _bytes(value: Any) -> bytes:
    """A reply value as bytes (the client does not decode, so this is a copy at most)."""
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _decode(session_id: str, letter_id: str, data: bytes) -> DeadLetter:
    """A stored letter, or what a listing reports for bytes that are not one."""
    try:
        return unpack_letter(data)
    except WireError as exc:
        return unreadable_letter(letter_id, session_id, data, str(exc))


class RedisDeadLetterStore(_Role):
    """Letters in the hash `Keys.dead_letters(session)` (letter id -> packed letter), listed
    across the namespace through `Keys.dead_index` (letter ids by `dead_at`).

    The index is a superset kept honest by its readers, like the stale index of
    `RedisIdempotencyStore`: a letter's id goes in with score 0 in the pipeline of the script
    that adds it (so a writer that dies right after still leaves it listed), then at its real
    `dead_at`; a reader settles score-0 members to their letter's `dead_at` before paging, and
    drops members whose letter is gone (removed by an id whose index write was lost, or never
    added). A session's own letters are read from its hash alone.
    """

    async def add(self, letter: DeadLetter) -> bool:
        """Keep the letter once (`dead_at` 0 is stamped with the server clock by the script)."""
        session_id = check_letter(letter)
        keys = self._keys
        (added, stamp), _ = await run_batch(
            self._client,
            [
                Call(
                    self._scripts.dead_add,
                    [keys.dead_letters(session_id)],
                    [letter.letter_id, pack_letter(letter)],
                ),
                Call(None, ["ZADD", keys.dead_index, "NX", "0", letter.letter_id]),
            ],
        )
        # The letter is kept by now: a failed index write leaves the member at 0 for readers to
        # settle, so it must not report the add failed.
        if float(stamp) > 0:
            try:
                await self._client.zadd(keys.dead_index, {letter.letter_id: float(stamp)}, gt=True)
            except Exception as exc:
                logger.warning("dead-letter index update for %s failed: %s", letter.letter_id, exc)
        return bool(int(added))

    async def plant_raw(self, session_id: str, letter_id: str, data: bytes) -> None:
        """Test hook: store arbitrary bytes as a letter (to plant corrupt ones), indexed at 0
        as a script's writer leaves it (readers settle it)."""
        await self._client.hset(self._keys.dead_letters(session_id), letter_id, data)
        await self._client.zadd(self._keys.dead_index, {letter_id: 0})

    async def list(
        self, limit: int, session_id: str | None = None, before: float | None = None
    ) -> list[DeadLetter]:
        """Up to `limit` letters, newest first, strictly older than `before` when given.

        One session: its hash. All: the index, page by page from `before` down, each member
        checked against its letter (one pipelined HGET per page).
        """
        if limit <= 0:
            return []
        if session_id is not None:
            stored: dict[Any, Any] = await self._client.hgetall(self._keys.dead_letters(session_id))
            letters = [_decode(session_id, _text(k), _bytes(v)) for k, v in stored.items()]
            if before is not None:
                letters = [letter for letter in letters if letter.dead_at < before]
            letters.sort(key=lambda letter: (letter.dead_at, letter.letter_id), reverse=True)
            return letters[:limit]
        await self._settle()
        high = "+inf" if before is None else f"({_num(before)}"
        found: dict[str, DeadLetter] = {}
        offset = 0
        while len(found) < limit:
            hits = await self._client.zrevrangebyscore(
                self._keys.dead_index, high, "(0", start=offset, num=_SCAN_BATCH, withscores=True
            )
            kept, dropped = await self._verify(_scored(hits), "HGET")
            for letter_id, session, data in kept:
                found.setdefault(letter_id, _decode(session, letter_id, _bytes(data)))
            # Dropped members left the range: the next page starts that much earlier.
            offset += len(hits) - dropped
            if len(hits) < _SCAN_BATCH:
                break
        return list(found.values())[:limit]

    async def get(self, letter_id: str) -> DeadLetter | None:
        """The letter, or None."""
        session_id = letter_session(letter_id)
        if session_id is None:
            return None
        data = await self._client.hget(self._keys.dead_letters(session_id), letter_id)
        return None if data is None else _decode(session_id, letter_id, _bytes(data))

    async def remove(self, letter_ids: Sequence[str]) -> int:
        """Drop these letters and their index members; how many were kept (one round trip)."""
        by_session: dict[str, list[str]] = defaultdict(list)
        for letter_id in dict.fromkeys(letter_ids):
            session_id = letter_session(letter_id)
            if session_id is not None:
                by_session[session_id].append(letter_id)
        if not by_session:
            return 0
        members = [letter_id for ids in by_session.values() for letter_id in ids]
        replies = await run_batch(
            self._client,
            [
                *(
                    Call(None, ["HDEL", self._keys.dead_letters(session_id), *ids])
                    for session_id, ids in by_session.items()
                ),
                Call(None, ["ZREM", self._keys.dead_index, *members]),
            ],
        )
        return sum(int(reply) for reply in replies[:-1])

    async def purge(self, session_id: str | None = None) -> int:
        """Drop every letter of the session, or of every session the index names."""
        if session_id is not None:
            hash_key = self._keys.dead_letters(session_id)
            letter_ids = [_text(field) for field in await self._client.hkeys(hash_key)]
            if not letter_ids:
                return 0
            removed, _ = await run_batch(
                self._client,
                [
                    Call(None, ["HDEL", hash_key, *letter_ids]),
                    Call(None, ["ZREM", self._keys.dead_index, *letter_ids]),
                ],
            )
            return int(removed)
        members = [_text(m) for m in await self._client.zrange(self._keys.dead_index, 0, -1)]
        sessions = dict.fromkeys(s for m in members if (s := letter_session(m)) is not None)
        junk = [m for m in members if letter_session(m) is None]
        if junk:
            await self._client.zrem(self._keys.dead_index, *junk)
        return sum([await self.purge(session) for session in sessions])

    async def count(self, session_id: str | None = None) -> int:
        """How many letters the session has (its hash), or the namespace (the verified index)."""
        if session_id is not None:
            return int(await self._client.hlen(self._keys.dead_letters(session_id)))
        await self._settle()
        total = offset = 0
        while True:
            hits = await self._client.zrange(
                self._keys.dead_index, offset, offset + _SCAN_BATCH - 1, withscores=True
            )
            kept, dropped = await self._verify(_scored(hits), "HEXISTS")
            total += len(kept)
            offset += len(hits) - dropped
            if len(hits) < _SCAN_BATCH:
                return total

    async def _verify(self, members: _Members, command: str) -> tuple[_Kept, int]:
        """Check index members against their letters with `command` (HGET or HEXISTS): the
        (letter id, session, reply) of each still kept, and how many dead members were
        dropped (a member rescored since it was read is left alone)."""
        named = [(m, s, session) for m, s in members if (session := letter_session(m))]
        replies = await run_batch(
            self._client,
            [Call(None, [command, self._keys.dead_letters(session), m]) for m, _, session in named],
        )
        kept: _Kept = []
        dead: _Members = [(m, s) for m, s in members if not letter_session(m)]
        for (member, score, session), reply in zip(named, replies, strict=True):
            if reply is None or reply == 0:
                dead.append((member, score))
            else:
                kept.append((member, session, reply))
        drops = await run_batch(
            self._client,
            [
                Call(self._scripts.index_drop, [self._keys.dead_index], [member, _num(score)])
                for member, score in dead
            ],
        )
        return kept, sum(int(done) for done in drops)

    async def _settle(self) -> None:
        """Give index members still at 0 their letter's `dead_at` (or drop them: no letter)."""
        index, scripts = self._keys.dead_index, self._scripts
        for _ in range(_SCAN_ROUNDS):
            due = await self._client.zrangebyscore(index, "-inf", 0, start=0, num=_SCAN_BATCH)
            hits = [_text(m) for m in due]
            kept, _ = await self._verify([(m, 0.0) for m in hits], "HGET")
            await run_batch(
                self._client,
                [
                    Call(
                        scripts.index_rescore,
                        [index],
                        [letter_id, "0", _num(stamp_of(_bytes(data)) or _UNKNOWN_STAMP)],
                    )
                    for letter_id, _, data in kept
                ],
            )
            if len(hits) < _SCAN_BATCH:
                return
