"""A graceful shutdown answers its callers with something that stays true: the queued work it
hands on either runs and its caller gets that answer, or it is withdrawn and never runs."""

from __future__ import annotations

import asyncio

import pytest

from stickless import FailureCode, TurnFailedError

from .agents import Journal, req
from .conftest import make_cluster


@pytest.mark.parametrize("grace", [0.0, 0.1, 2.0])
async def test_a_caller_told_its_turn_failed_never_sees_it_run(
    journal: Journal, grace: float
) -> None:
    async with make_cluster(journal, nodes=2) as cluster:
        closing, survivor = cluster.nodes
        journal.gate("long")
        # Given a running turn and three turns queued behind it on the node that shuts down
        running = await closing.submit(req("s1", "long"))
        await journal.entered["long"].wait()
        queued = [await closing.submit(req("s1", f"queued {n}")) for n in range(3)]
        # When that node closes gracefully
        await closing.aclose(grace=grace)
        answers = await asyncio.gather(
            *(d.result for d in [running, *queued]), return_exceptions=True
        )
        # Then the running turn ended SHUTDOWN, and every queued one either ran (and its caller
        # got that result) or was withdrawn (and never runs, not even later on the survivor)
        assert isinstance(answers[0], TurnFailedError)
        assert answers[0].code is FailureCode.SHUTDOWN
        follow_up = await survivor.submit(req("s1", "after"))
        await follow_up.result
        for n, answer in enumerate(answers[1:]):
            text = f"queued {n}"
            if isinstance(answer, TurnFailedError):
                assert answer.code is FailureCode.SHUTDOWN, answer
                assert text not in journal.texts("s1"), f"{text} was answered {answer} but ran"
            else:
                assert not isinstance(answer, BaseException), answer
                assert answer.text == f"echo:{text}"
                assert journal.texts("s1").count(text) == 1
