"""The `stickless` command line: the demo runs end to end and shows every scene."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import uuid

import pytest

from stickless import DeploymentMode, RouterConfig, SessionRouter, SubmitKind
from stickless.backends.base import ReservationState, letter_for_unreadable, letter_id_for
from stickless.backends.redis import RedisBackends
from stickless.cli import DEMO_CONFIG, main

from .agents import Journal, ScriptedOpener, req, wait_until
from .conftest import FAST
from .dead_letters import dead_turn
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
        rf"subscriber on {watcher.group(1)} saw TurnFailed\(code='HOLDER_LOST'\) "
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
    assert "saw TurnFailed(code='HOLDER_LOST')" in out
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


# ---------------------------------------------------------------------- dlq


async def test_dlq_list_show_replay_and_purge_against_a_live_node(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a router node over Redis, a dead letter of a turn whose key k1 is FAILED, and the
    # letter of an unreadable entry
    journal = Journal()
    namespace = f"dlq{uuid.uuid4().hex[:6]}"
    config = RouterConfig(node_id="dlq-node", mode=DeploymentMode.DISTRIBUTED, **FAST)
    backends = RedisBackends.from_url(redis_url, namespace=namespace)
    node = SessionRouter.build(config=config, opener=ScriptedOpener(journal), backends=backends)
    await node.start()
    try:
        request = req("s1", "hello again", idempotency_key="k1")
        failed = await dead_turn(backends, request, "c:k1")
        junk = letter_for_unreadable("s2", "m-9", None, None, "undecodable msgpack", b"\xc1 x")
        for letter in (failed, junk):
            await node.dead_letters.bury(letter)

        async def dlq(*argv: str) -> tuple[int, str, str]:
            code = await asyncio.to_thread(
                main, ["dlq", *argv, "--redis", redis_url, "--namespace", namespace]
            )
            out, err = capsys.readouterr()
            return code, out, err

        # list: one line per letter with its id, session, turn, key, reason, attempts and age
        code, out, _ = await dlq("list")
        assert code == 0
        lines = sorted(out.splitlines())
        assert len(lines) == 2
        assert lines[0].split("  ")[:4] == [failed.letter_id, "s1", "old-turn", "k1"]
        assert '"last attempt failed"' in lines[0] and "attempts=1" in lines[0]
        assert re.search(r"age=\d+[smhd]$", lines[0]), lines[0]
        code, out, _ = await dlq("list", "--session", "s2", "--limit", "5")
        assert code == 0 and out.split("  ")[:2] == [junk.letter_id, "s2"]
        # show: the letter as JSON, its input as text, unreadable bytes as base64
        code, out, _ = await dlq("show", failed.letter_id)
        shown = json.loads(out)
        assert code == 0 and shown["envelope"]["input"] == "hello again"
        assert shown["idempotency_key"] == "k1" and shown["attempts"][0]["attempt"] == 1
        code, out, _ = await dlq("show", junk.letter_id)
        assert code == 0 and json.loads(out)["raw"] == {"base64": "wSB4"}
        # replay of the unreadable letter is refused, and of an unknown one not found
        code, _, err = await dlq("replay", junk.letter_id)
        assert code == 1 and "no readable message" in err
        code, _, err = await dlq("replay", letter_id_for("s1", "nope", ""))
        assert code == 1 and "DeadLetterNotFoundError" in err
        # When the failed turn's letter is replayed
        code, out, _ = await dlq("replay", failed.letter_id)
        found = re.search(r"as turn ([0-9a-f]{32}) of session s1 under key 'k1'", out)
        assert code == 0 and found is not None, out
        turn_id = found.group(1)

        # Then the node ran it, and its answer is k1's: what a client retry gets
        async def answered() -> bool:
            found = await backends.idempotency.find("s1", "c:k1")
            return found is not None and found.state is ReservationState.DONE

        await wait_until(answered)
        reservation = await backends.idempotency.find("s1", "c:k1")
        assert reservation is not None and reservation.outcome is not None
        assert reservation.outcome.turn_id == turn_id
        assert reservation.outcome.text == "echo:hello again"
        assert reservation.outcome.executed_by == node.node_id
        assert journal.texts("s1") == ["hello again"]
        retry = await node.submit(request)
        assert retry.kind is SubmitKind.CACHED and (await retry.result).turn_id == turn_id
        assert await backends.dead_letters.get(failed.letter_id) is None
        # purge refuses without --yes, then removes what is left
        code, _, err = await dlq("purge")
        assert code == 1 and "without --yes" in err
        assert await backends.dead_letters.count() == 1
        code, out, _ = await dlq("purge", "--yes")
        assert code == 0 and "purged 1" in out
        code, out, _ = await dlq("list")
        assert code == 0 and out == "no dead letters\n"
        # usage errors exit 2
        assert (await dlq("list", "--limit", "0"))[0] == 2
        assert (await dlq("show", "not-a-letter"))[0] == 2
        assert (await dlq("purge", "--session", "bad{id}", "--yes"))[0] == 2
    finally:
        await node.aclose(grace=0.5)
        await backends.aclose()


def test_dlq_needs_an_action_and_redis(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dlq"]) == 2
    assert main(["dlq", "list"]) == 2
    assert main(["dlq", "show", "--redis", "redis://h/0"]) == 2
    capsys.readouterr()


#: What `scripts/run.sh demo` does not install: importing any of them fails in the demo below.
OPTIONAL = ["redis", "ray", "fastapi", "uvicorn", "httpx", "prometheus_client", "opentelemetry"]


@pytest.mark.timeout(90)
def test_the_demo_runs_on_the_base_package_alone() -> None:
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in OPTIONAL)
    code = f"import sys; {blocked}; from stickless.cli import main; sys.exit(main(['demo']))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=80, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "demo finished" in done.stdout
