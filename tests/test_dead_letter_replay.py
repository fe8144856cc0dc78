"""`router.dead_letters`: listing through the router, and replay under the original key (the
key's FAILED reservation is replaced; a key answered or in flight elsewhere refuses it)."""

from __future__ import annotations

import pytest

from stickless import (
    DeadLetterNotFoundError,
    InvalidRequestError,
    ReplayRefusedError,
    SubmitKind,
)
from stickless.backends.base import ReservationState, letter_for_unreadable
from stickless.testing import LocalCluster

from .agents import Journal, req
from .dead_letters import dead_turn


async def test_replay_runs_the_message_under_its_original_key(
    backend_cluster: LocalCluster, journal: Journal
) -> None:
    # Given a dead letter of a turn whose key k1 is FAILED
    a, b, _ = backend_cluster.nodes
    request = req("s1", "hello again", idempotency_key="k1")
    letter = await dead_turn(a.backends, request, "c:k1")
    assert await a.dead_letters.bury(letter) is True
    assert await a.dead_letters.bury(letter) is False
    assert [x.letter_id for x in await b.dead_letters.list()] == [letter.letter_id]
    # When it is replayed through another node
    replayed = await b.dead_letters.replay(letter.letter_id)
    # Then the message ran as a new turn under k1, and the letter is gone
    assert replayed.idempotency_key == "k1" and replayed.removed
    assert replayed.disposition is not None
    result = await replayed.disposition.result
    assert result.turn_id == replayed.turn_id != "old-turn"
    assert result.text == "echo:hello again"
    assert journal.texts("s1") == ["hello again"]
    assert await a.dead_letters.get(letter.letter_id) is None
    # And k1's answer is that turn's: the client's retry gets it from the cache
    reservation = await a.backends.idempotency.find("s1", "c:k1")
    assert reservation is not None and reservation.state is ReservationState.DONE
    retry = await a.submit(request)
    assert retry.kind is SubmitKind.CACHED and retry.turn_id == replayed.turn_id
    # And a second replay of the same letter finds nothing to replay
    with pytest.raises(DeadLetterNotFoundError):
        await b.dead_letters.replay(letter.letter_id)


async def test_a_letter_without_a_readable_message_is_not_replayed(cluster: LocalCluster) -> None:
    node = cluster.nodes[0]
    letter = letter_for_unreadable("s1", "m-7", None, None, "undecodable msgpack", b"\xc1")
    await node.dead_letters.bury(letter)
    with pytest.raises(ReplayRefusedError, match=r"no readable message.*undecodable msgpack"):
        await node.dead_letters.replay(letter.letter_id)
    assert await node.dead_letters.get(letter.letter_id) is not None


async def test_a_key_answered_or_in_flight_under_another_turn_refuses_the_replay(
    cluster: LocalCluster, journal: Journal
) -> None:
    node = cluster.nodes[0]
    # Given a letter whose key k2 has since been answered by another turn
    request = req("s1", "answered", idempotency_key="k2")
    letter = await dead_turn(node.backends, request, "c:k2")
    await node.dead_letters.bury(letter)
    done = await node.submit(request)
    await done.result
    # When it is replayed, then it is refused naming that turn, and the letter is kept
    with pytest.raises(ReplayRefusedError, match=f"answered by turn {done.turn_id}"):
        await node.dead_letters.replay(letter.letter_id)
    assert await node.dead_letters.get(letter.letter_id) is not None
    # Given a letter whose key k3 is in flight under a running turn
    gate = journal.gate("running")
    request = req("s2", "running", idempotency_key="k3")
    letter = await dead_turn(node.backends, request, "c:k3")
    await node.dead_letters.bury(letter)
    running = await node.submit(request)
    await journal.entered["running"].wait()
    # Then its replay is refused too, and nothing ran twice
    with pytest.raises(ReplayRefusedError, match=f"in flight under turn {running.turn_id}"):
        await node.dead_letters.replay(letter.letter_id)
    gate.set()
    await running.result
    assert journal.texts("s2") == ["running"]
    assert await node.dead_letters.get(letter.letter_id) is not None


async def test_a_letter_of_a_turn_without_a_client_key_replays_without_one(
    cluster: LocalCluster,
) -> None:
    node = cluster.nodes[0]
    request = req("s1", "no key")
    letter = await dead_turn(node.backends, request, "t:old-turn")
    await node.dead_letters.bury(letter)
    replayed = await node.dead_letters.replay(letter.letter_id)
    assert replayed.idempotency_key is None
    assert replayed.disposition is not None
    assert (await replayed.disposition.result).text == "echo:no key"


async def test_bad_arguments_name_their_field_and_purge_clears(cluster: LocalCluster) -> None:
    letters = cluster.nodes[0].dead_letters
    with pytest.raises(InvalidRequestError, match="letter_id"):
        await letters.get("nope")
    with pytest.raises(InvalidRequestError, match="letter_id"):
        await letters.replay("nope")
    with pytest.raises(InvalidRequestError, match="limit"):
        await letters.list(limit=0)
    with pytest.raises(InvalidRequestError, match="session_id"):
        await letters.list(session_id="bad{id}")
    with pytest.raises(InvalidRequestError, match="before"):
        await letters.list(before=float("inf"))
    with pytest.raises(InvalidRequestError, match="session_id"):
        await letters.purge("")
    for i in range(3):
        await letters.bury(letter_for_unreadable(f"s{i % 2}", f"m-{i}", None, None, "bad", None))
    assert await letters.purge("s0") == 2
    assert await letters.remove([x.letter_id for x in await letters.list()]) == 1
    assert await letters.list() == []
