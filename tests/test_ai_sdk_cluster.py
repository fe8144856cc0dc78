"""The AI SDK drop-in, tested with the real `ai` package from the npm registry: Node's test
runner drives the SDK's own chat client (`AbstractChat` over `DefaultChatTransport`, the core
of `useChat`) against three `stickless serve` nodes over Redis behind haproxy
(`clients/ai-sdk-test/ai_sdk.spec.mjs`; `scripts/run.sh test` runs `npm ci` there first).

Node and the installed packages are required under CI=true, skipped otherwise when missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .mp_cluster import REPO_ROOT
from .web_cluster import WebCluster

CLIENT = REPO_ROOT / "clients" / "ai-sdk-test"
SPEC = CLIENT / "ai_sdk.spec.mjs"
TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
#: Bound of the whole Node run (its tests take about twenty seconds).
RUN_TIMEOUT = 240


def _missing(what: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what}, but CI=true requires it")
    pytest.skip(what)


def node_executable() -> str:
    """Node, with the client's packages installed (`npm ci` in clients/ai-sdk-test)."""
    node = shutil.which("node")
    if node is None:
        _missing("node is not installed")
    if not (CLIENT / "node_modules" / "ai" / "package.json").is_file():
        _missing(f"the npm packages are not installed (run `npm ci` in {CLIENT})")
    assert node is not None
    return node


def test_the_ai_sdk_chat_client_runs_against_the_cluster(redis_url: str, tmp_path: Path) -> None:
    node = node_executable()
    with WebCluster(
        redis_url, tmp_path, nodes=3, tokens=TOKENS, opener="tests.ai_sdk_agent:make_opener"
    ) as cluster:
        pids = {n.node_id: n.process.pid for n in cluster.nodes if n.process is not None}
        env = {
            **os.environ,
            "STICKLESS_URL": cluster.url,
            "STICKLESS_NODES": json.dumps(pids),
        }
        run = subprocess.run(
            [node, "--test", "--test-reporter=tap", SPEC.name],
            cwd=CLIENT,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
    report = f"{run.stdout}\n{run.stderr}\n(node logs in {tmp_path})"
    assert run.returncode == 0, report
    # Every test ran and passed (a skipped one, or one not found, fails here too).
    assert "\n# pass 6\n" in run.stdout and "\n# fail 0\n" in run.stdout, report


def test_the_readme_shows_the_transport_the_tests_use() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### AI SDK (useChat)", 1)[1]
    shown = section.split("```js\n", 1)[1].split("```", 1)[0]
    assert shown == (CLIENT / "chat_transport.mjs").read_text(encoding="utf-8")
