"""A session is bound to an agent only once an opener accepted it: a refused first agent leaves
it unbound, and first submits for different agents (concurrent, forwarded, queued) still end
with one binding and every other agent's turn answered CONFLICTING_AGENT; over memory and
Redis."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest

from stickless import (
    ConflictingAgentError,
    FailureCode,
    LiveSession,
    SubmitDisposition,
    SubmitKind,
    SubmitRequest,
    TurnFailedError,
)
from stickless.testing import LocalCluster

from .agents import Journal, ScriptedOpener, wait_until
from .conftest import BACKENDS, FAST
from .test_failures import QUICK, lease_expired


class Registry:
    """Opens scripted sessions for the agents it knows and refuses any other name (as an
    opener over a registry of agents does); an open of an agent in `holds` waits until its
    event is set."""

    def __init__(self, journal: Journal, known: tuple[str, ...] = ("bot", "helper")) -> None:
        self._inner = ScriptedOpener(journal)
        self._known = known
        self.holds: dict[str, asyncio.Event] = {}
        #: Set, by agent, when an open of it has started (and waits on its hold, if any).
        self.opening: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        self.opening[agent_ref].set()
        if agent_ref in self.holds:
            await self.holds[agent_ref].wait()
        if agent_ref not in self._known:
            raise LookupError(f"no agent named {agent_ref!r}")
        return await self._inner.open(session_id, agent_ref, attributes)


MakeCluster = Callable[..., LocalCluster]


@pytest.fixture
def registry(journal: Journal) -> Registry:
    return Registry(journal)


@pytest.fixture(params=BACKENDS)
def make_cluster(request: pytest.FixtureRequest, registry: Registry) -> MakeCluster:
    """Two nodes over the selected backend, opening sessions through `registry`:
    `make_cluster(**config_overrides)`."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        return lambda **kw: LocalCluster.over_redis(url, 2, opener=registry, **{**FAST, **kw})
    return lambda **kw: LocalCluster(2, opener=registry, **{**FAST, **kw})


@pytest.fixture
async def cluster(make_cluster: MakeCluster) -> AsyncIterator[LocalCluster]:
    async with make_cluster() as running:
        yield running


def ask(agent: str, text: str) -> SubmitRequest:
    return SubmitRequest(session_id="s1", agent_ref=agent, input=text)


async def failure(submitted: SubmitDisposition) -> TurnFailedError:
    with pytest.raises(TurnFailedError) as failed:
        await submitted.result
    return failed.value


async def test_a_refused_first_agent_leaves_the_session_unbound(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b = cluster.nodes
    # Given a session's first submit names an agent the opener refuses
    refused = await failure(await a.submit(ask("nope", "typo")))
    assert refused.code is FailureCode.FAILED and "no agent named 'nope'" in refused.detail
    # Then the session stays unbound
    assert await cluster.backends.records.binding("s1") is None
    # And the next submit with a good agent runs (from either node) and binds it
    done = await (await b.submit(ask("bot", "hello"))).result
    assert done.text == "echo:hello"
    assert await cluster.backends.records.binding("s1") == "bot"
    # And only now is another agent refused, before anything is reserved
    with pytest.raises(ConflictingAgentError, match="bound to agent 'bot', not 'nope'"):
        await a.submit(ask("nope", "typo again"))
    assert journal.texts("s1") == ["hello"]


async def test_messages_queued_while_unbound_are_judged_when_the_binding_is_written(
    cluster: LocalCluster, registry: Registry, journal: Journal
) -> None:
    a, b = cluster.nodes
    # Given the first turn (a refused agent) is being opened on node a
    registry.holds["nope"] = asyncio.Event()
    first = await a.submit(ask("nope", "typo"))
    await registry.opening["nope"].wait()
    # And, while the session is unbound, node b forwards a turn for "bot", then one for "helper"
    good = await b.submit(ask("bot", "hello"))
    other = await b.submit(ask("helper", "hi there"))
    # When the opener answers
    registry.holds["nope"].set()
    # Then the refused agent's turn failed and bound nothing, the first accepted agent is bound
    # and ran, and the queued turn for another agent is answered CONFLICTING_AGENT, never run
    assert (await failure(first)).code is FailureCode.FAILED
    assert (await good.result).text == "echo:hello"
    conflict = await failure(other)
    assert conflict.code is FailureCode.CONFLICTING_AGENT
    assert isinstance(conflict, ConflictingAgentError)
    assert "bound to agent 'bot'" in conflict.detail
    assert await cluster.backends.records.binding("s1") == "bot"
    assert journal.texts("s1") == ["hello"]


async def test_concurrent_first_submits_for_two_agents_bind_one(
    cluster: LocalCluster, journal: Journal
) -> None:
    a, b = cluster.nodes
    # When two nodes take a new session's first submits, for two agents, at once
    answers = await asyncio.gather(
        a.submit(ask("bot", "from a")), b.submit(ask("helper", "from b")), return_exceptions=True
    )
    outcomes: dict[str, str] = {}
    for agent, answer in zip(("bot", "helper"), answers, strict=True):
        if isinstance(answer, ConflictingAgentError):
            outcomes[agent] = "conflict"  # refused by the reserve: bound already
            continue
        assert isinstance(answer, SubmitDisposition)
        try:
            await answer.result
        except ConflictingAgentError:
            outcomes[agent] = "conflict"  # queued while unbound, judged once bound
        else:
            outcomes[agent] = "ran"
    # Then exactly one agent is bound and ran, and the other one's turn is a conflict
    bound = await cluster.backends.records.binding("s1")
    assert bound in ("bot", "helper")
    assert outcomes == {agent: "ran" if agent == bound else "conflict" for agent in outcomes}
    assert len(journal.texts("s1")) == 1


async def test_a_holder_paused_past_its_lease_binds_nothing(
    make_cluster: MakeCluster, registry: Registry, journal: Journal
) -> None:
    # (no holder-loss sweep within the test: the fence answers, not the sweep)
    async with make_cluster(**{**QUICK, "holder_loss_sweep_interval": 600.0}) as cluster:
        a, b = cluster.nodes
        # Given node a is opening the session's first agent, slowly
        registry.holds["bot"] = asyncio.Event()
        late = await a.submit(ask("bot", "late"))
        await registry.opening["bot"].wait()
        # And a is paused past its lease, and b takes the session for another agent, whose
        # open is slow too
        a.renewer.pause()
        await wait_until(lambda: lease_expired(cluster), within=10)
        registry.holds["helper"] = asyncio.Event()
        taken = await b.submit(ask("helper", "from b"))
        assert taken.kind is SubmitKind.EXECUTED_LOCALLY
        await registry.opening["helper"].wait()
        # When a's opener accepts its agent, and a binds it under its old lease
        registry.holds["bot"].set()
        await wait_until(lambda: "s1" in journal.closed, within=10)  # a's handle, closed unused
        # Then the fence refused that binding: the session is still unbound
        assert await cluster.backends.records.binding("s1") is None
        # And b binds its own agent and runs; a's turn is answered without running
        registry.holds["helper"].set()
        assert (await taken.result).text == "echo:from b"
        assert await cluster.backends.records.binding("s1") == "helper"
        a.renewer.resume()
        assert (await failure(late)).code is FailureCode.CONFLICTING_AGENT
        assert journal.texts("s1") == ["from b"]
