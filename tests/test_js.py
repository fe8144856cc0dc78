"""The Node tests (`node --test`) of the JavaScript client (clients/js/test/) and of the chat
page's markdown renderer (tests/js/), run here so the test command runs them: a failing Node
test fails this one, with Node's report. The client tests start their own `stickless serve`
nodes over this session's redis-server; any process they leave behind is stopped by its pid."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .mp_cluster import REPO_ROOT
from .redis_fixture import RedisServer
from .web_cluster import _require

SCRIPTS = [
    "clients/js/test/client.test.mjs",
    "tests/js/markdown.test.mjs",
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("script", SCRIPTS)
def test_node(script: str, redis_server: RedisServer, tmp_path: Path) -> None:
    node = _require("node")
    redis_server.start()
    pids = tmp_path / "pids"
    env = {
        **os.environ,
        "STICKLESS_PYTHON": sys.executable,
        "STICKLESS_REDIS_URL": redis_server.url,
        "STICKLESS_PID_FILE": str(pids),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    try:
        run = subprocess.run(
            [node, "--test", "--test-reporter=spec", script],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=200,
        )
    finally:
        for line in pids.read_text().split() if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line), signal.SIGKILL)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    # Every test ran: a skip (a missing service) is not a pass here.
    for count in ("fail 0", "cancelled 0", "skipped 0"):
        assert re.search(rf"\b{count}\b", report), report


def test_readme_shows_the_client_example() -> None:
    """The README's JavaScript snippet is clients/js/example.mjs, which the client tests run."""
    example = (REPO_ROOT / "clients/js/example.mjs").read_text("utf-8")
    readme = (REPO_ROOT / "README.md").read_text("utf-8")
    assert f"```js\n{example}```" in readme
