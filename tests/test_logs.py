"""Log records name their node, session and turn (as `extra` fields), never quote the
conversation above DEBUG, and come out as JSON lines with `--log-format json`."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest

from stickless import TurnFailedError, cli
from stickless._logs import JsonFormatter, get_logger, log_context
from stickless.testing import LocalCluster

from .agents import Journal, req

SECRET = "my-card-number-4111"


def _stickless_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name.startswith("stickless")]


async def _failed_turn(cluster: LocalCluster, journal: Journal) -> tuple[str, str]:
    """A turn whose agent fails with an error that quotes its input; (node, turn id)."""
    a, b, _ = cluster.nodes
    await (await a.submit(req("s1", "warm up"))).result
    text = f"pay with {SECRET}"
    journal.terminal.add(text)
    # Submitted on B, run by A (the holder)
    disposition = await b.submit(req("s1", text))
    with pytest.raises(TurnFailedError):
        await disposition.result
    return a.node_id, disposition.turn_id


async def test_a_record_of_a_turn_names_its_node_session_and_turn(
    cluster: LocalCluster, journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stickless")
    node, turn_id = await _failed_turn(cluster, journal)
    (failed,) = [r for r in _stickless_records(caplog) if r.getMessage().startswith("turn failed")]
    assert (failed.node_id, failed.session_id, failed.turn_id) == (node, "s1", turn_id)  # type: ignore[attr-defined]


async def test_no_record_quotes_the_conversation_unless_debug_asks(
    cluster: LocalCluster, journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stickless")
    await _failed_turn(cluster, journal)
    formatter = JsonFormatter()
    shown = "\n".join(formatter.format(r) for r in _stickless_records(caplog))
    assert "turn failed: TerminalError" in shown
    assert SECRET not in shown
    # At DEBUG the agent's error is logged whole (so the check above can see it)
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="stickless")
    journal.terminal.add(f"again {SECRET}")
    with pytest.raises(TurnFailedError):
        await (await cluster.nodes[0].submit(req("s1", f"again {SECRET}"))).result
    assert SECRET in "\n".join(r.getMessage() for r in _stickless_records(caplog))


def test_a_json_record_carries_the_context_fields_and_explicit_extra() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("stickless.test-json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with log_context(node_id="n1", session_id="s1"), log_context(turn_id="t1"):
            get_logger("stickless.test-json").warning("took %d tries", 3, extra={"key": "k"})
        get_logger("stickless.test-json").warning("outside")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert inside["message"] == "took 3 tries" and inside["level"] == "WARNING"
    assert (inside["node_id"], inside["session_id"], inside["turn_id"]) == ("n1", "s1", "t1")
    assert inside["key"] == "k" and inside["logger"] == "stickless.test-json"
    assert not {"node_id", "session_id", "turn_id"} & outside.keys()


def test_the_cli_logs_json_lines_when_asked(redis_url: str) -> None:
    # A real command, configured by the real entry point: the dead-letter listing of an
    # empty namespace, with a stickless record logged while it runs
    script = (
        "import sys\n"
        "from stickless import cli\n"
        "from stickless._logs import get_logger, log_context\n"
        "real = cli._cmd_dlq\n"
        "def logged(args):\n"
        "    with log_context(node_id='n9'):\n"
        "        get_logger('stickless.cli-test').warning('listing')\n"
        "    return real(args)\n"
        "cli._cmd_dlq = logged\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    argv = ["dlq", "list", "--redis", redis_url, "--namespace", "logs-test"]
    done = subprocess.run(
        [sys.executable, "-c", script, *argv, "--log-format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    record = json.loads(line)
    assert (record["message"], record["node_id"]) == ("listing", "n9")
    text = subprocess.run(
        [sys.executable, "-c", script, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert text.returncode == 0, text.stderr
    assert "WARNING stickless.cli-test: listing [node_id=n9]" in text.stderr


def test_log_options_go_before_or_after_the_command() -> None:
    parser = cli.build_parser()
    before = parser.parse_args(["--log-format", "json", "serve"])
    after = parser.parse_args(["serve", "--log-format", "json", "--log-level", "info"])
    default = parser.parse_args(["serve"])
    assert (before.log_format, after.log_format, default.log_format) == ("json", "json", "text")
    assert (after.log_level, default.log_level) == ("INFO", "WARNING")
