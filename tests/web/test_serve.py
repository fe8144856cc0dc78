"""`stickless serve`: the embedded default with the demo agent, tokens, the exposure check and
a graceful SIGTERM, as real processes on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from stickless.cli import main
from stickless.local_services import free_port
from tests.web_cluster import REPO_ROOT, _ready_line, _spawn, _stop

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


#: Starts the CLI the way the installed `stickless` script does: its own directory, not the
#: current one, is first on sys.path.
LAUNCHER = "import sys\nfrom stickless.cli import main\nsys.exit(main())\n"
APP = "from stickless.demo.opener import make_opener\n"


def test_an_opener_beside_the_command_is_found_without_pythonpath(tmp_path: Path) -> None:
    bin_dir, app_dir = tmp_path / "bin", tmp_path / "app"
    bin_dir.mkdir()
    app_dir.mkdir()
    (bin_dir / "stickless_cli.py").write_text(LAUNCHER)
    (app_dir / "myagents.py").write_text(APP)
    port = free_port()
    log = tmp_path / "serve.log"
    args = [sys.executable, str(bin_dir / "stickless_cli.py"), "serve", "--port", str(port),
            "--opener", "myagents:make_opener"]  # fmt: skip
    process = _spawn(args, log, cwd=app_dir)
    try:
        _ready_line(process, "stickless serve", log)
        accepted = httpx.post(f"http://127.0.0.1:{port}/v1/sessions/s1/turns", json=turn("hi"))
        assert accepted.status_code == 202, accepted.text
    finally:
        _stop(process)


def test_a_missing_opener_module_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "stickless_cli.py").write_text(LAUNCHER)
    args = [sys.executable, str(tmp_path / "stickless_cli.py"), "serve", "--port", "0",
            "--opener", "nosuchapp.agents:make_opener"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False,
                          cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "stickless serve: opener 'nosuchapp.agents:make_opener': no module named " \
           "'nosuchapp' in the current directory" in done.stderr  # fmt: skip
