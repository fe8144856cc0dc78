"""The examples run as documented: each adapter on a LocalCluster, and behind a real
`stickless serve` process."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from stickless.local_services import free_port
from tests.web_cluster import REPO_ROOT, _ready_line, _spawn, _stop

EXAMPLES = REPO_ROOT / "examples"


def test_the_pydantic_ai_example_runs_three_turns_on_three_nodes() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "pydantic_ai_app.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and len({line.split()[0] for line in lines}) == 3
    assert "0 message(s) before it" in lines[0]
    assert lines[1].split(": ", 1)[1].startswith("It is ")  # the clock tool answered
    assert "2 message(s) before it" in lines[2]


def _served_turns(tmp_path: Path, opener: str, texts: list[str]) -> list[str]:
    """The answers of `texts`, one turn each of one session, from a real `stickless serve`
    running `opener` (stopped by its pid)."""
    port = free_port()
    args = [sys.executable, "-m", "stickless", "serve", "--port", str(port), "--opener", opener]
    process = _spawn(args, tmp_path / "serve.log")
    try:
        _ready_line(process, "stickless serve", tmp_path / "serve.log")
        url = f"http://127.0.0.1:{port}/v1/sessions/chat/turns"
        answers = []
        for text in texts:
            accepted = httpx.post(url, json={"agent_ref": "assistant", "input": text})
            assert accepted.status_code == 202, accepted.text
            location = f"http://127.0.0.1:{port}{accepted.headers['location']}"
            view = httpx.get(location, params={"wait": 30}, timeout=40).json()
            assert view["state"] == "completed", view
            answers.append(view["result"]["text"].strip())
    finally:
        _stop(process, signal.SIGTERM)
    return answers


@pytest.mark.timeout(90)
def test_the_pydantic_ai_example_serves_over_http(tmp_path: Path) -> None:
    texts = _served_turns(tmp_path, "examples.pydantic_ai_app:make_opener", ["hello", "and again"])
    assert texts == [
        "You said 'hello'; 0 message(s) before it.",
        "You said 'and again'; 1 message(s) before it.",
    ]


@pytest.mark.timeout(90)
def test_the_openai_agents_example_serves_over_http(tmp_path: Path) -> None:
    asked = ["Hello, I am Ann.", "What is the weather in Oslo?", "Thanks!"]
    texts = _served_turns(tmp_path, "examples.openai_agents_app:make_opener", asked)
    assert texts[0] == "(offline, message 1 of this session) You said: Hello, I am Ann."
    assert "sunny in Oslo" in texts[1]  # the weather tool ran
    assert texts[2] == "(offline, message 3 of this session) You said: Thanks!"


def _uvicorn(tmp_path: Path, redis_url: str, node: str) -> tuple[subprocess.Popen[bytes], str]:
    """examples/embedded_app.py under uvicorn as its docstring says; the process and its URL
    once /readyz answers."""
    port = free_port()
    args = [sys.executable, "-m", "uvicorn", "examples.embedded_app:app", "--port", str(port)]
    env = {"STICKLESS_REDIS_URL": redis_url, "STICKLESS_NODE_ID": node}
    process = _spawn(args, tmp_path / f"{node}.log", env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return process, url
        time.sleep(0.1)  # polling a process we do not control: no event to await
    _stop(process, signal.SIGKILL)
    raise AssertionError(f"{node} did not get ready; see {tmp_path / f'{node}.log'}")


@pytest.mark.timeout(90)
def test_the_embedded_app_example_serves_a_session_from_two_nodes(
    tmp_path: Path, redis_url: str
) -> None:
    nodes = [_uvicorn(tmp_path, redis_url, f"embedded-{i}") for i in (1, 2)]
    try:
        (_, one), (_, two) = nodes
        # The app's own route and stickless's, side by side
        assert httpx.get(f"{one}/hello").json()["node"].startswith("embedded-1/")
        accepted = httpx.post(f"{one}/v1/sessions/s1/turns",
                              json={"agent_ref": "demo-agent", "input": "hello"})  # fmt: skip
        assert accepted.status_code == 202, accepted.text
        # The other node answers the turn from the shared Redis
        view = httpx.get(two + accepted.headers["location"], params={"wait": 20}, timeout=30)
        assert view.json()["state"] == "completed", view.text
        assert view.json()["executed_by"].startswith("embedded-1/")
    finally:
        for process, _ in nodes:
            _stop(process, signal.SIGTERM)
    # Each stopped within the grace, with its lifespan closed without an error (uvicorn ends by
    # raising the SIGTERM it caught again, once shut down; a hung one would be SIGKILLed)
    assert [process.returncode for process, _ in nodes] == [-signal.SIGTERM] * 2
    for node in ("embedded-1", "embedded-2"):
        assert "Traceback" not in (tmp_path / f"{node}.log").read_text()
