"""Scenario `history`: what a turn pays for its history when the session already holds N
committed messages (500; quick: 200), with the pydantic-ai adapter over Redis on one node.

Two sessions of the same history take turns in alternation: one through the adapter as it is
(its handle keeps the history it read and loads only what was committed since), the baseline
through the same adapter made to reload the whole history every turn (what an agent does when
it is never told whether its entries committed). Each turn's history cost is the time from the
turn's start to the model's first call (load, decode, the agent's setup); the turn itself is
timed end to end. The model is pydantic-ai's offline FunctionModel, so neither side waits for
a provider.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from ..wire import Outcome
from ._stats import ratio, summarize

if TYPE_CHECKING:
    from ._runner import BenchContext

TITLE = "Per-turn history cost with 500 committed messages: incremental loads vs full reload"
BASELINE = "the same adapter reloading the whole history every turn"


async def run(ctx: BenchContext) -> dict[str, Any]:
    try:
        from ..integrations import pydantic_ai as adapter
    except ImportError as exc:
        raise RuntimeError(f"the history scenario needs the pydantic-ai extra: {exc}") from None
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from .._config import DeploymentMode, RouterConfig
    from .._session import TurnContext
    from .._types import SubmitRequest, TurnOutput
    from ..backends.base import StagedCommit
    from ..backends.redis import RedisBackends
    from ..router import SessionRouter

    messages: int = ctx.pick(500, 200)
    turns: int = ctx.pick(40, 8)
    history_ms: dict[str, list[float]] = {"incremental": [], "reload": []}

    class Timed(adapter.PydanticAISession):
        """The adapter as it is, timing each turn's start to the model's first call."""

        kind = "incremental"

        def __init__(self, session_id: str) -> None:
            super().__init__(Agent(FunctionModel(stream_function=self._model)), session_id)
            self._started = 0.0

        async def run_turn(self, turn: TurnContext) -> TurnOutput:
            self._started = time.perf_counter()
            return await super().run_turn(turn)

        async def _model(self, _: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
            history_ms[self.kind].append((time.perf_counter() - self._started) * 1000)
            yield "ok"

    class Reloading(Timed):
        """The baseline: forgets what it read, so every turn loads the whole history."""

        kind = "reload"

        async def turn_ended(self, ending: Any) -> None:
            self.messages, self.version = [], 0

    class Opener:
        async def open(
            self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
        ) -> Timed:
            return Reloading(session_id) if agent_ref == "reload" else Timed(session_id)

    earlier: list[ModelMessage] = []
    for n in range(messages // 2):
        earlier.append(ModelRequest(parts=[UserPromptPart(content=f"question {n} " * 8)]))
        earlier.append(ModelResponse(parts=[TextPart(content=f"answer {n} " * 24)]))
    entries = tuple(adapter.entries_of(earlier))
    turn_ms: dict[str, list[float]] = {"incremental": [], "reload": []}
    backends = RedisBackends.from_url(ctx.redis_url, namespace=ctx.unique("history"))
    config = RouterConfig(node_id=ctx.unique("history-node-"), mode=DeploymentMode.DISTRIBUTED)
    router = SessionRouter.build(config=config, opener=Opener(), backends=backends)
    await router.start()
    try:
        for kind in history_ms:  # each session starts with the same committed history
            session, seed = f"history-{kind}", f"seed-{kind}"
            await backends.records.provision(session, kind, 1)
            await backends.idempotency.put_if_absent(session, seed, seed, "-", "seed", 60, 3600)
            done = Outcome(turn_id=seed, ok=True, executed_by="seed")
            commit = StagedCommit(1, entries)
            await backends.hotpath.finish(session, seed, "seed", done, 3600.0, commit)
        for index in range(turns + 1):
            for kind in ("incremental", "reload") if index % 2 else ("reload", "incremental"):
                ask = SubmitRequest(session_id=f"history-{kind}", agent_ref=kind, input="next")
                t0 = time.perf_counter()
                await (await router.submit(ask)).result
                if index == 0:  # (each first turn opens its handle and reads it all: not timed)
                    history_ms[kind].clear()
                else:
                    turn_ms[kind].append((time.perf_counter() - t0) * 1000)
        ctx.progress(f"{turns} turns each over {messages} messages done")
    finally:
        await router.aclose(grace=1.0)
        await backends.aclose()
    return _report(history_ms, turn_ms, messages, turns)


def _report(
    history_ms: dict[str, list[float]], turn_ms: dict[str, list[float]], messages: int, turns: int
) -> dict[str, Any]:
    history = {kind: summarize(values) for kind, values in history_ms.items()}
    turn = {kind: summarize(values) for kind, values in turn_ms.items()}
    ratios = {
        "history_p50": ratio(history["incremental"].get("p50"), history["reload"].get("p50")),
        "turn_p50": ratio(turn["incremental"].get("p50"), turn["reload"].get("p50")),
    }
    rows = [
        [
            f"history cost per turn p50 (ms), {messages} messages",
            history["incremental"].get("p50"),
            history["reload"].get("p50"),
            ratios["history_p50"],
        ],
        [
            "turn p50 (ms)",
            turn["incremental"].get("p50"),
            turn["reload"].get("p50"),
            ratios["turn_p50"],
        ],
    ]
    return {
        "config": {"messages": messages, "turns": turns},
        "results": {"history_ms": history, "turn_ms": turn},
        "ratios": ratios,
        "rows": rows,
        "goals": [],
        "notes": [
            "history cost = the turn's start on its handle to the model's first call (load, "
            "decode, the agent's setup); each turn adds 2 messages, so the history grows",
        ],
    }
