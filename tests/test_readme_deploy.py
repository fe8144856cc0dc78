"""What the README shows of the deployment guide is what the tests run: the haproxy config is
deploy/haproxy.cfg (which tests/web_cluster.py loads), and the Python client snippet runs
against a real `stickless serve`."""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

import pytest

from stickless.local_services import free_port

from .web_cluster import DEPLOY, REPO_ROOT, _ready_line, _spawn, _stop

README = (REPO_ROOT / "README.md").read_text()


def _block_after(marker: str, fence: str) -> str:
    start = README.index(marker)
    match = re.compile(rf"```{fence}\n(.*?)```", re.DOTALL).search(README, start)
    assert match is not None, f"no ```{fence} block after {marker!r}"
    return match[1]


def test_the_readme_shows_deploy_haproxy_cfg() -> None:
    shown = _block_after("**Load balancers.**", "")
    config = (DEPLOY / "haproxy.cfg").read_text()
    assert shown == config[config.index("global\n") :]


@pytest.mark.timeout(60)
def test_the_readme_python_client_snippet_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snippet = _block_after("**The Python client.**", "python")
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"T": "me"}))
    port = free_port()
    args = [sys.executable, "-m", "stickless", "serve", "--port", str(port), "--tokens",
            str(tokens)]  # fmt: skip
    process = _spawn(args, tmp_path / "serve.log")
    try:
        _ready_line(process, "stickless serve", tmp_path / "serve.log")
        exec(snippet.replace("127.0.0.1:8000", f"127.0.0.1:{port}"), {})
    finally:
        _stop(process, signal.SIGTERM)
    printed = capsys.readouterr().out
    assert printed.startswith("you said 'hello'")
    assert "you said 'tell me a story'" in printed
