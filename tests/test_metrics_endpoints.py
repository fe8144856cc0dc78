"""The exported metrics of real processes: `GET /metrics` of `stickless serve` nodes over one
redis-server after turns, an idle eviction and a holder loss (a node SIGKILLed mid-turn), and
`stickless node --metrics-port`; every figure is checked by its exact change.

Waits are a turn's bounded `?wait=` lookup, an SSE stream read until the frame that matters, or
`/metrics` polled (with a deadline) until the figure a background sweep moves appears.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stickless.local_services import free_port

from .mp_cluster import FAST_CONFIG, NodeProcess
from .test_web_cluster import STORY, TIMEOUT, WAIT, is_terminal, sse, texts, turn_body
from .web_cluster import WebNode

#: How long a figure moved by a background sweep (eviction, holder loss) may take to appear.
SWEEP_DEADLINE = 30.0

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of `url`/metrics, by name and labels."""
    answer = httpx.get(f"{url}/metrics", timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (0 when it was never moved)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    """How much one sample changed between two scrapes."""
    return value(after, name, **labels) - value(before, name, **labels)


def scrape_until(url: str, reached: Callable[[Samples], bool], what: str) -> Samples:
    """Poll `url`/metrics until `reached` holds (bounded by SWEEP_DEADLINE)."""
    deadline = time.monotonic() + SWEEP_DEADLINE
    while True:
        samples = scrape(url)
        if reached(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {SWEEP_DEADLINE}s")
        time.sleep(0.1)  # polling another process's figures: no event to await


def post_turn(url: str, sid: str, text: str, **options: Any) -> str:
    answer = httpx.post(f"{url}/v1/sessions/{sid}/turns", json=turn_body(text, **options))
    assert answer.status_code == 202, answer.text
    turn_id: str = answer.json()["turn_id"]
    return turn_id


def ended(url: str, sid: str, tid: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/v1/sessions/{sid}/turns/{tid}?wait={WAIT}", timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    view: dict[str, Any] = answer.json()
    assert view["state"] in ("completed", "failed"), view
    return view


@pytest.fixture
def serve_nodes(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., WebNode]]:
    """Start `stickless serve` nodes over one namespace; each is stopped by its pid."""
    namespace = f"metrics{os.getpid()}x{free_port()}"
    started: list[WebNode] = []

    def start(config: dict[str, Any] | None = None) -> WebNode:
        node = WebNode(len(started), redis_url, namespace, tmp_path, None, config)
        started.append(node)
        node.start()
        return node

    try:
        yield start
    finally:
        for node in started:
            node.terminate()


def test_serve_counts_turns_and_an_idle_eviction(serve_nodes: Callable[..., WebNode]) -> None:
    node = serve_nodes({"idle_ttl": 1.0})
    before = scrape(node.url)
    # Given three turns of one session, queued back to back on its holder
    sid = "s-three-turns"
    tids = [post_turn(node.url, sid, f"message {n}") for n in (1, 2, 3)]
    assert [ended(node.url, sid, tid)["state"] for tid in tids] == ["completed"] * 3
    # When the session then stays idle past its idle TTL
    after = scrape_until(
        node.url,
        lambda s: (
            value(s, "stickless_evictions_total", reason="IDLE") > 0
            and value(s, "stickless_sessions_held") == 0
        ),
        "idle eviction",
    )
    # Then the three turns, their submits and the one eviction moved their counters exactly
    assert moved(before, after, "stickless_turns_total", result="completed") == 3
    assert moved(before, after, "stickless_turn_duration_seconds_count", result="completed") == 3
    assert moved(before, after, "stickless_submits_total", kind="EXECUTED_LOCALLY") == 3
    assert moved(before, after, "stickless_evictions_total", reason="IDLE") == 1
    assert moved(before, after, "stickless_lease_acquire_seconds_count", won="true") == 1
    assert moved(before, after, "stickless_takeover_rejected_total") == 0
    assert value(after, "stickless_pending_entries") == 0


def test_serve_survivor_counts_the_holder_loss_it_declares(
    serve_nodes: Callable[..., WebNode],
) -> None:
    holder, survivor = serve_nodes(), serve_nodes()
    # Given a session held by one node
    sid = "s-holder-loss"
    assert ended(holder.url, sid, post_turn(holder.url, sid, "warm up"))["state"] == "completed"
    before = scrape(survivor.url)
    # And a slow turn of it submitted on the other, streaming from the holder
    url = f"{survivor.url}/v1/sessions/{sid}/turns"
    with sse("POST", url, json=turn_body("tell me a story", **STORY)) as stream:
        stream.until(lambda f: len(texts(stream.frames)) >= 3)
        # When the holder is SIGKILLed mid-turn
        holder.sigkill()
        end = stream.until(is_terminal)
    assert end.event == "turn_failed" and end.data["code"] == "HOLDER_LOST", end
    # Then the survivor, which declared the loss, counted it once, as that turn's end
    after = scrape_until(
        survivor.url,
        lambda s: value(s, "stickless_turns_total", result="HOLDER_LOST") > 0,
        "holder loss",
    )
    assert moved(before, after, "stickless_holder_loss_total") == 1
    assert moved(before, after, "stickless_turns_total", result="HOLDER_LOST") == 1
    # (the turn ran on the holder: nothing completed here)
    assert moved(before, after, "stickless_turns_total", result="completed") == 0
    assert moved(before, after, "stickless_submits_total", kind="FORWARDED") == 1
    # (not checked: takeover_rejected, which moves when the survivor later collects the lost
    # turn's message and the store refuses to run it again, once or twice by the race of the
    # sweep and that collect; see the README, "Prometheus and Grafana")


async def test_node_serves_its_metrics_on_metrics_port(redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    namespace = f"metrics{os.getpid()}x{free_port()}"
    node = NodeProcess(
        "metrics-node", redis_url, namespace, FAST_CONFIG, tmp_path, metrics_port=port
    )
    await node.start()
    try:
        url = f"http://127.0.0.1:{port}"
        before = scrape(url)
        # When three turns run on the node
        for n in (1, 2, 3):
            turn = await node.client.submit(
                {"session_id": "s1", "agent_ref": "bot", "input": f"t{n}"}
            )
            assert (await node.client.result(turn["turn_id"])).text
        # Then its metrics port shows them, exactly
        after = scrape(url)
        assert moved(before, after, "stickless_turns_total", result="completed") == 3
        assert moved(before, after, "stickless_submits_total", kind="EXECUTED_LOCALLY") == 3
    finally:
        await node.terminate()
