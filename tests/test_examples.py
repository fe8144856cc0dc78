"""The examples run as documented: each adapter on a LocalCluster, and behind a real
`stickless serve` process."""

from __future__ import annotations

import signal
import subprocess
import sys
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
