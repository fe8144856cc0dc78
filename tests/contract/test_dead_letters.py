"""DeadLetterStore contract: idempotent add, newest-first paging, get, remove, purge, count,
round trips, a corrupt stored letter, and (Redis) the namespace index's repair."""

from __future__ import annotations

import time
from dataclasses import replace

from stickless._types import UserInput
from stickless.backends.base import (
    MAX_RAW_BYTES,
    AttemptRecord,
    Backends,
    DeadLetter,
    letter_for_envelope,
    letter_for_unreadable,
    letter_id_for,
    pack_letter,
)
from stickless.wire import Envelope

from .conftest import PlantLetter


def _envelope(session_id: str, turn_id: str) -> Envelope:
    return Envelope(
        session_id=session_id,
        turn_id=turn_id,
        agent_ref="agent-a",
        input=UserInput.text(f"input of {turn_id}"),
        key=f"c:key-{turn_id}",
    )


def _letter(
    session_id: str, turn_id: str, dead_at: float = 0.0, reason: str = "boom"
) -> DeadLetter:
    attempts = (
        AttemptRecord(attempt=1, node="n1/aa", error="ValueError: bad", at=10.5),
        AttemptRecord(attempt=2, node="n2/bb", error="ValueError: worse", at=12.25),
    )
    letter = letter_for_envelope(_envelope(session_id, turn_id), f"m-{turn_id}", reason, attempts)
    return replace(letter, dead_at=dead_at)


async def test_add_is_idempotent_by_letter_id_and_stamps_the_store_clock(
    backends: Backends,
) -> None:
    # Given a letter added with no time of death
    store = backends.dead_letters
    letter = _letter("s1", "t1")
    before = time.time()
    assert await store.add(letter) is True
    # When the same letter (same id, another reason) is added again
    again = await store.add(replace(letter, reason="other"))
    # Then nothing changed: the first letter is kept, stamped with the store clock
    assert again is False
    kept = await store.get(letter.letter_id)
    assert kept is not None and kept.reason == "boom"
    assert before - 5 < kept.dead_at < time.time() + 5
    assert await store.count() == 1
    assert await store.count("s1") == 1


async def test_list_is_newest_first_pages_by_dead_at_and_filters_by_session(
    backends: Backends,
) -> None:
    # Given five letters of two sessions that died at 100..104
    store = backends.dead_letters
    letters = [_letter("a" if i % 2 else "b", f"t{i}", dead_at=100.0 + i) for i in range(5)]
    for letter in letters:
        await store.add(letter)
    newest_first = [letter.letter_id for letter in reversed(letters)]
    # When the namespace is listed whole, then in pages of two
    whole = await store.list(10)
    first = await store.list(2)
    second = await store.list(2, before=first[-1].dead_at)
    third = await store.list(2, before=second[-1].dead_at)
    # Then each page continues where the last one ended, newest first
    assert [letter.letter_id for letter in whole] == newest_first
    assert [letter.letter_id for letter in first + second + third] == newest_first
    assert len(third) == 1
    # And a session's listing holds only its letters, pageable the same way
    only_a = await store.list(10, session_id="a")
    assert [letter.turn_id for letter in only_a] == ["t3", "t1"]
    assert [x.turn_id for x in await store.list(10, session_id="a", before=103.0)] == ["t1"]
    assert await store.list(0) == []


async def test_get_of_unknown_or_malformed_ids_is_none(backends: Backends) -> None:
    store = backends.dead_letters
    await store.add(_letter("s1", "t1", dead_at=5.0))
    assert await store.get(letter_id_for("s1", "other", "m-x")) is None
    assert await store.get("not-a-letter-id") is None
    assert await store.get("") is None


async def test_remove_drops_only_the_named_letters(backends: Backends) -> None:
    # Given three letters
    store = backends.dead_letters
    one, two, three = (_letter("s1", f"t{i}", dead_at=float(i + 1)) for i in range(3))
    for letter in (one, two, three):
        await store.add(letter)
    # When one is removed (named twice), with an unknown and a malformed id
    removed = await store.remove([two.letter_id, two.letter_id, letter_id_for("s9", "x", ""), "?"])
    # Then exactly that one is gone everywhere, and removing it again removes nothing
    assert removed == 1
    assert await store.get(two.letter_id) is None
    assert [x.letter_id for x in await store.list(10)] == [three.letter_id, one.letter_id]
    assert await store.count() == 2
    assert await store.remove([two.letter_id]) == 0


async def test_purge_of_one_session_then_of_everything(backends: Backends) -> None:
    # Given letters of two sessions
    store = backends.dead_letters
    for i in range(3):
        await store.add(_letter("a", f"a{i}", dead_at=float(i + 1)))
    for i in range(2):
        await store.add(_letter("b", f"b{i}", dead_at=float(i + 10)))
    # When session a is purged
    assert await store.purge("a") == 3
    # Then only b's letters are left, and a purge of a again finds nothing
    assert await store.count("a") == 0
    assert await store.count() == 2
    assert {x.session_id for x in await store.list(10)} == {"b"}
    assert await store.purge("a") == 0
    # When everything is purged
    assert await store.purge() == 2
    # Then nothing is left
    assert await store.count() == 0
    assert await store.list(10) == []


async def test_a_letter_round_trips_envelope_attempts_and_raw_bytes(backends: Backends) -> None:
    # Given a failed message's letter and an unreadable entry's letter (bytes past the bound)
    store = backends.dead_letters
    failed = _letter("s1", "t1", dead_at=50.0)
    big = bytes(range(256)) * (MAX_RAW_BYTES // 256 + 4)
    unreadable = replace(
        letter_for_unreadable("s1", "m-9", "t9", "c:k9", "undecodable", big), dead_at=51.0
    )
    await store.add(failed)
    await store.add(unreadable)
    # When both are read back
    got_failed = await store.get(failed.letter_id)
    got_unreadable = await store.get(unreadable.letter_id)
    # Then every field survived; the raw bytes were cut to the bound, and the reason says so
    assert got_failed == failed
    assert got_failed.envelope == _envelope("s1", "t1")
    assert [a.attempt for a in got_failed.attempts] == [1, 2]
    assert got_unreadable == unreadable
    assert got_unreadable.envelope is None
    assert got_unreadable.raw == big[:MAX_RAW_BYTES]
    assert f"entry of {len(big)} bytes" in got_unreadable.reason
    assert (got_unreadable.turn_id, got_unreadable.idempotency_key) == ("t9", "k9")


async def test_a_corrupt_stored_letter_is_listed_as_unreadable(
    backends: Backends, plant_letter: PlantLetter
) -> None:
    # Given two good letters and, between them, bytes that are not a letter
    store = backends.dead_letters
    await store.add(_letter("s1", "t1", dead_at=10.0))
    await store.add(_letter("s2", "t3", dead_at=30.0))
    bad_id = letter_id_for("s1", "t2", "m-t2")
    header = pack_letter(_letter("s1", "t2", dead_at=20.0))[:11]  # a readable time, then junk
    await plant_letter("s1", bad_id, header + b"\xc1 junk")
    # When the namespace and the session are listed, and the bad letter is read
    listed = await store.list(10)
    session = await store.list(10, session_id="s1")
    got = await store.get(bad_id)
    # Then the listing is whole and in order, the bad letter reported as unreadable
    assert [x.turn_id for x in listed] == ["t3", None, "t1"]
    assert [x.letter_id for x in session] == [bad_id, listed[2].letter_id]
    assert got is not None and got.reason.startswith("unreadable stored letter")
    assert got.envelope is None and got.raw == header + b"\xc1 junk"
    assert got.dead_at == 20.0
    # And it can be removed like any letter
    assert await store.remove([bad_id]) == 1
    assert await store.count() == 2


async def test_redis_index_members_without_letters_are_dropped(redis_url: str) -> None:
    from stickless.backends.redis import RedisBackends

    bundle = RedisBackends.from_url(redis_url, namespace="contract")
    try:
        store, client, index = bundle.dead_letters, bundle.client, bundle.keys.dead_index
        # Given a letter, an index member whose letter is gone, and a malformed member
        kept = _letter("s1", "t1", dead_at=10.0)
        await store.add(kept)
        stray = letter_id_for("s1", "gone", "m-gone")
        await client.zadd(index, {stray: 20.0, "junk": 15.0})
        # When the namespace is listed and counted
        listed = await store.list(10)
        counted = await store.count()
        # Then only the real letter is reported, and the index no longer names the others
        assert [x.letter_id for x in listed] == [kept.letter_id]
        assert counted == 1
        assert await client.zscore(index, stray) is None
        assert await client.zscore(index, "junk") is None
        assert await client.zscore(index, kept.letter_id) == 10.0
    finally:
        await bundle.aclose()


async def test_redis_an_unsettled_index_member_gets_its_letters_time(redis_url: str) -> None:
    from stickless.backends.redis import RedisBackends

    bundle = RedisBackends.from_url(redis_url, namespace="contract")
    try:
        store, client, index = bundle.dead_letters, bundle.client, bundle.keys.dead_index
        # Given letters whose writer died before moving their members off 0 (as a script's
        # writer leaves them)
        old, new = _letter("s1", "t1", dead_at=10.0), _letter("s2", "t2", dead_at=30.0)
        for letter in (old, new):
            await store.add(letter)
            await client.zadd(index, {letter.letter_id: 0})
        # When the namespace is listed
        listed = await store.list(10, before=31.0)
        # Then they are listed in order, and their members carry their letters' times
        assert [x.letter_id for x in listed] == [new.letter_id, old.letter_id]
        assert await client.zscore(index, old.letter_id) == 10.0
        assert await client.zscore(index, new.letter_id) == 30.0
    finally:
        await bundle.aclose()
