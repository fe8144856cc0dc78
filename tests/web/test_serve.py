"""`stickless serve`: the embedded default with the demo agent, tokens, the exposure check and
a graceful SIGTERM, as real processes on loopback."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import httpx
import pytest

from stickless.cli import main
from stickless.local_services import free_port
from tests.web_cluster import _ready_line, _spawn, _stop

from .conftest import turn


def _serve(tmp_path: Path, *extra: str) -> tuple[object, str]:
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    process = _spawn([sys.executable, "-m", "stickless", "serve", "--port", str(port), *extra],
                     log)
    try:
        line = _ready_line(process, "stickless serve", log)
    except BaseException:
        _stop(process)
        raise
    assert line.split()[1] == str(port)
    return process, f"http://127.0.0.1:{port}"


def test_a_public_host_without_tokens_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "--tokens" in capsys.readouterr().err


def test_the_embedded_default_serves_the_demo_chat_and_stops_on_sigterm(tmp_path: Path) -> None:
    process, url = _serve(tmp_path)
    try:
        assert "<!doctype html" in httpx.get(f"{url}/").text.lower()
        accepted = httpx.post(f"{url}/v1/sessions/s1/turns", json=turn("hello"))
        assert accepted.status_code == 202
        done = httpx.get(url + accepted.headers["location"], params={"wait": 10}).json()
        assert done["state"] == "completed" and "hello" in done["result"]["text"]
    finally:
        _stop(process, signal.SIGTERM)  # type: ignore[arg-type]
    assert process.returncode == 0  # type: ignore[attr-defined]


def test_tokens_guard_every_api_route(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"secret": "alice"}))
    process, url = _serve(tmp_path, "--tokens", str(tokens))
    try:
        assert httpx.post(f"{url}/v1/sessions/s1/turns", json=turn("x")).status_code == 401
        ok = httpx.post(f"{url}/v1/sessions/s1/turns", json=turn("x"),
                        headers={"Authorization": "Bearer secret"})
        assert ok.status_code == 202
    finally:
        _stop(process)  # type: ignore[arg-type]
