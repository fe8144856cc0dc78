"""The `stickless` command line: the demo runs end to end and shows every scene."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from stickless import RouterConfig
from stickless.cli import DEMO_CONFIG, main

from .ray_cluster import import_ray
from .redis_fixture import redis_executable


def _check_demo_output(out: str) -> None:
    # Scene 1: a submit entered a node that did not hold the session and was forwarded.
    assert re.search(r"submit\s+chat-\d\s+msg \d\s+via node-\w\s+-> FORWARDED", out), out
    forwarded = re.findall(
        r"result\s+(chat-\d)\s+msg \d\s+via (node-\w)\s+-> ran on (node-\w)", out
    )
    assert any(via != ran for _, via, ran in forwarded), out
    # Scene 2: a subscriber on one node received text streamed by a turn on another node.
    streamed = re.search(
        r"stream\s+(node-\w) <- turn on (node-\w): you said .*\[turn_completed\]", out
    )
    assert streamed is not None, out
    assert streamed.group(1) != streamed.group(2)
    assert re.search(r"got [1-9]\d* text deltas from a turn that ran on node-\w", out), out
    # Scene 3: an interrupt from a non-holder ended the turn for the caller and the subscriber.
    sent = re.search(r"interrupt\(reason='USER'\) sent from (node-\w) \(holder is (node-\w)\)", out)
    assert sent is not None, out
    assert sent.group(1) != sent.group(2)
    assert "TurnFailedError(code=INTERRUPTED)" in out
    assert "saw Interrupted(reason='USER')" in out
    assert "the interrupted turn committed 0 entries" in out
    # Scene 4: the retry got the same turn from the cache and the agent did not run again.
    cached = re.search(
        r"same turn id: yes; result ready at submit: yes; agent executions (\d+) -> (\d+)", out
    )
    assert cached is not None, out
    assert cached.group(1) == cached.group(2)
    assert "IdempotencyConflictError (HTTP 409)" in out
    # Scene 5: the holder is killed mid-turn; a forwarded caller and a remote subscriber hear
    # HOLDER_LOST and the next turn runs on a survivor over the committed transcript.
    held = re.search(r"holder\s+chat-crash\s+held by (node-\w)", out)
    assert held is not None, out
    holder = held.group(1)
    story = re.search(r"submit\s+chat-crash\s+story\s+via (node-\w)\s+-> FORWARDED", out)
    assert story is not None, out
    caller = story.group(1)
    watcher = re.search(r"subscriber opened on (node-\w)", out[held.end() :])
    assert watcher is not None, out
    assert len({holder, caller, watcher.group(1)}) == 3, out
    assert re.search(rf"kill\s+{holder} crashes mid-turn .* caller waits on {caller}", out), out
    lost = re.search(
        rf"caller on {caller} got TurnFailedError\(code=HOLDER_LOST\) (\d+\.\d+)s after the kill",
        out,
    )
    assert lost is not None, out
    assert re.search(
        rf"subscriber on {watcher.group(1)} saw Interrupted\(reason='HOLDER_LOST'\) "
        r"\d+\.\d+s after the kill",
        out,
    ), out
    before = re.search(r"chat-crash\s+(\d+) committed entries in the record store after", out)
    assert before is not None, out
    assert int(before.group(1)) == 2, out
    served = re.search(
        r"next turn served by survivor (node-\w); it saw (\d+) committed entries of earlier "
        r"turns; (\d+) committed now",
        out,
    )
    assert served is not None, out
    assert served.group(1) != holder
    assert served.group(2) == before.group(1)
    assert int(served.group(3)) == int(before.group(1)) + 2
    # Scene 6: the summary tables, with the killed node listed as killed.
    assert "Scene 6/6: summary" in out
    assert re.search(r"session\s+submits\s+forwarded\s+cached\s+turns run", out), out
    assert re.search(r"node\s+state\s+received\s+executed locally\s+forwarded", out), out
    assert re.search(rf"^\s+{holder}\s+killed\s+\d", out, re.MULTILINE), out
    assert len(re.findall(r"^\s+node-\w\s+alive\s+\d", out, re.MULTILINE)) == 2, out
    assert "no session ever ran two turns at the same time" in out
    assert "demo finished in" in out
    assert "FAILED" not in out


def test_demo_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    # (the demo bounds itself: past its --timeout, 30 s by default, it exits non-zero)
    code = main(["demo"])
    out = capsys.readouterr().out
    assert code == 0, out
    _check_demo_output(out)


def test_demo_over_redis(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    # The same scenes with every node over a real Redis, each with its own connections
    code = main(["demo", "--redis", redis_url])
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(r"over Redis at (redis://)?127\.0\.0\.1:\d+", out), out
    _check_demo_output(out)


def test_python_dash_m_demo() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stickless", "demo"],
        capture_output=True,
        text=True,
        timeout=45,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _check_demo_output(done.stdout)


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--help"]) == 0
    assert "--nodes" in capsys.readouterr().out


def test_bad_arguments_exit_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--nodes", "1"]) == 2
    assert main(["nonsense"]) == 2
    capsys.readouterr()


def test_demo_config_is_valid() -> None:
    config = RouterConfig(**DEMO_CONFIG)
    assert config.lease_extend_interval < config.lease_ttl


def _check_ray_demo_output(out: str) -> None:
    label = r"n\d/[0-9a-f]{4}"
    assert re.search(r"deploy\s+3 routers \(one per Ray node", out), out
    # Scene 1: submits through different routers, some forwarded to the holder's router.
    forwarded = re.findall(rf"result\s+chat-\d\s+msg \d\s+via ({label})\s+-> ran on ({label})", out)
    assert any(via != ran for via, ran in forwarded), out
    assert re.search(rf"submit\s+chat-\d\s+msg \d\s+via {label}\s+-> FORWARDED", out), out
    # Scene 2: a subscriber on one router streamed a turn that ran on another.
    streamed = re.search(
        rf"stream\s+({label}) <- turn on ({label}): you said .*\[turn_completed\]", out
    )
    assert streamed is not None, out
    assert streamed.group(1) != streamed.group(2)
    assert re.search(rf"router {label} relayed [1-9]\d* text deltas", out), out
    # Scene 3: an interrupt from a router that does not hold the session.
    sent = re.search(
        rf"interrupt\(reason='USER'\) sent from ({label}) \(holder is ({label})\)", out
    )
    assert sent is not None, out
    assert sent.group(1) != sent.group(2)
    assert "TurnFailedError(code=INTERRUPTED)" in out
    assert "saw Interrupted(reason='USER')" in out
    assert "the interrupted turn committed 0 entries" in out
    # Scene 4: the retry through another router came from the cache.
    assert re.search(r"same turn id: yes; committed entries (\d+) -> \1 ", out), out
    assert "IdempotencyConflictError (HTTP 409)" in out
    # Scene 5: ray.kill of the holder's router mid-turn.
    killed = re.search(rf"ray\.kill\(router ({label})\) mid-turn", out)
    assert killed is not None, out
    assert re.search(r"got TurnFailedError\(code=HOLDER_LOST\) \d+\.\d+s after the kill", out), out
    assert "saw Interrupted(reason='HOLDER_LOST')" in out
    served = re.search(rf"next turn served by survivor ({label}): placed \d+\.\d+s", out)
    assert served is not None, out
    assert served.group(1) != killed.group(1)
    recreated = re.search(rf"the reconciler started router ({label}) on the same Ray node", out)
    assert recreated is not None, out
    new, old = recreated.group(1), killed.group(1)
    assert new.split("/")[0] == old.split("/")[0] and new != old  # same node, new incarnation
    # Scene 6: summary with the killed router and the measured failover.
    assert re.search(rf"^\s+{re.escape(old)}\s+killed\s+\d", out, re.MULTILINE), out
    assert re.search(r"failover\s+ray\.kill -> caller's HOLDER_LOST \d+\.\d+s", out), out
    assert "demo finished in" in out
    assert "FAILED" not in out


@pytest.mark.timeout(240)
def test_demo_on_a_local_ray_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    # Starts a 3-node Ray cluster on loopback and a private redis-server, both stopped at the end
    import_ray()  # (sets the loopback environment before Ray is first imported)
    import socket

    redis_executable()  # fails under CI=true, skips elsewhere, when redis-server is missing
    code = main(["demo", "--ray", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    _check_ray_demo_output(out)
    import ray

    assert not ray.is_initialized()
    url = re.search(r"private redis-server at redis://127\.0\.0\.1:(\d+)/0", out)
    assert url is not None, out
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(url.group(1))), 1):
        pass  # the demo's redis-server is gone


def test_ray_demo_agent_is_importable_by_path() -> None:
    import_ray()
    from stickless.node import load_opener

    opener = load_opener("stickless.ray._demo:make_opener")
    assert hasattr(opener, "open")


def test_ray_commands_parse() -> None:
    from stickless.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(
        ["ray-deploy", "--redis", "redis://h:6380/0", "--opener", "a.b:c", "--namespace", "n"]
    )
    assert (args.redis, args.opener, args.namespace, args.address) == (
        "redis://h:6380/0",
        "a.b:c",
        "n",
        "auto",
    )
    assert not args.no_fast_failover
    args = parser.parse_args(["ray-undeploy", "--namespace", "n"])
    assert args.command == "ray-undeploy"
    assert main(["ray-deploy", "--redis", "redis://h/0"]) == 2  # --opener is required
    assert main(["demo", "--ray", "1"]) == 2
