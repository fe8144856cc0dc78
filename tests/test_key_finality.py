"""Which answers stay an idempotency key's answer: a user's INTERRUPTED does (a retry gets it
again and nothing runs); an answer caused by the infrastructure leaves the key free."""

from __future__ import annotations

import pytest

from stickless import FailureCode, SubmitKind, TurnFailedError

from .agents import Journal, req
from .conftest import make_cluster


async def test_an_interrupted_key_keeps_its_answer(journal: Journal) -> None:
    async with make_cluster(journal, nodes=2) as cluster:
        a, b = cluster.nodes
        journal.gate("stop me")
        first = await a.submit(req("s1", "stop me", idempotency_key="k"))
        await journal.entered["stop me"].wait()
        # Given a turn the user interrupted
        assert await b.interrupt("s1") is True
        with pytest.raises(TurnFailedError) as interrupted:
            await first.result
        assert interrupted.value.code is FailureCode.INTERRUPTED
        # When the same request is retried with the same key, on either node
        for node in (a, b):
            retry = await node.submit(req("s1", "stop me", idempotency_key="k"))
            # Then it is answered from the key: INTERRUPTED again, and nothing runs
            assert retry.kind is SubmitKind.CACHED and retry.turn_id == first.turn_id
            with pytest.raises(TurnFailedError) as again:
                await retry.result
            assert again.value.code is FailureCode.INTERRUPTED
        assert journal.texts("s1") == ["stop me"]


async def test_a_shutdown_answer_leaves_the_key_free(journal: Journal) -> None:
    async with make_cluster(journal, nodes=2) as cluster:
        closing, survivor = cluster.nodes
        journal.gate("cut short")
        first = await closing.submit(req("s1", "cut short", idempotency_key="k"))
        await journal.entered["cut short"].wait()
        # Given a turn ended by a graceful shutdown of its node
        await closing.aclose(grace=0.0)
        with pytest.raises(TurnFailedError) as shut:
            await first.result
        assert shut.value.code is FailureCode.SHUTDOWN
        # When the request is retried with the same key
        journal.gates.clear()
        retry = await survivor.submit(req("s1", "cut short", idempotency_key="k"))
        # Then it runs fresh
        assert retry.kind is not SubmitKind.CACHED and retry.turn_id != first.turn_id
        assert (await retry.result).text == "echo:cut short"
