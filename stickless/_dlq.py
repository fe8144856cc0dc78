"""The `stickless dlq` commands: list, show, replay and purge the dead letters of a namespace
in Redis, from a process that is no cluster node.

Exit codes: 0 done, 1 not found or refused (or the store could not be reached), 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from ._config import RouterConfig
from ._errors import InvalidRequestError, SticklessError
from ._types import TextPart, UserInput
from .backends.base import Backends, DeadLetter
from .router import deliver_replay
from .router._dead_letters import check_letter_id, check_listing, check_session

#: Characters of a reason a `list` line shows.
_REASON_CHARS = 60


def main_dlq(args: argparse.Namespace) -> int:
    """Run one `dlq` subcommand against the Redis at `--redis`; returns the exit code."""
    try:
        from .backends.redis import RedisBackends
    except ImportError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    command = _COMMANDS[args.dlq_command]

    async def run() -> int:
        backends = RedisBackends.from_url(args.redis, namespace=args.namespace)
        try:
            return await command(backends, args)
        finally:
            await backends.aclose()

    try:
        return asyncio.run(run())
    except (InvalidRequestError, ValueError) as exc:  # a bad argument (ValueError: a bad URL)
        sys.stderr.write(f"stickless dlq: {exc}\n")
        return 2
    except SticklessError as exc:  # not found, refused, conflicting, unreachable
        sys.stderr.write(f"stickless dlq: {type(exc).__name__}: {exc}\n")
        return 1
    except Exception as exc:  # redis-py's own errors (a server that cannot be reached)
        sys.stderr.write(f"stickless dlq: {type(exc).__name__}: {exc}\n")
        return 1


async def _list(backends: Backends, args: argparse.Namespace) -> int:
    check_listing(args.limit, args.session, args.before)
    letters = await backends.dead_letters.list(args.limit, args.session, args.before)
    now = time.time()
    for letter in letters:
        reason = " ".join(letter.reason.split())
        if len(reason) > _REASON_CHARS:
            reason = reason[: _REASON_CHARS - 1] + "\u2026"
        fields = [
            letter.letter_id,
            letter.session_id,
            letter.turn_id or "-",
            letter.idempotency_key or "-",
            json.dumps(reason, ensure_ascii=False),
            f"attempts={len(letter.attempts)}",
            f"age={_age(now - letter.dead_at)}",
        ]
        sys.stdout.write("  ".join(fields) + "\n")
    if not letters:
        sys.stdout.write("no dead letters\n")
    return 0


async def _show(backends: Backends, args: argparse.Namespace) -> int:
    letter = await backends.dead_letters.get(check_letter_id(args.letter_id))
    if letter is None:
        sys.stderr.write(f"stickless dlq: no dead letter {args.letter_id}\n")
        return 1
    sys.stdout.write(json.dumps(letter_json(letter), indent=2, ensure_ascii=False) + "\n")
    return 0


async def _replay(backends: Backends, args: argparse.Namespace) -> int:
    config = RouterConfig(**json.loads(args.config)) if args.config else RouterConfig()
    origin = f"dlq-replay/{uuid.uuid4().hex[:8]}"
    result = await deliver_replay(backends, config, args.letter_id, origin)
    sys.stdout.write(
        f"replayed {result.letter_id} as turn {result.turn_id} of session {result.session_id} "
        f"under key {result.idempotency_key!r}\n"
    )
    if not result.removed:
        sys.stdout.write("the letter could not be removed: remove it once the turn is answered\n")
    return 0


async def _purge(backends: Backends, args: argparse.Namespace) -> int:
    check_session(args.session)
    if not args.yes:
        count = await backends.dead_letters.count(args.session)
        sys.stderr.write(f"stickless dlq: not purging {count} dead letter(s) without --yes\n")
        return 1
    removed = await backends.dead_letters.purge(args.session)
    sys.stdout.write(f"purged {removed} dead letter(s)\n")
    return 0


_COMMANDS: dict[str, Callable[[Backends, argparse.Namespace], Awaitable[int]]] = {
    "list": _list,
    "show": _show,
    "replay": _replay,
    "purge": _purge,
}


def _age(seconds: float) -> str:
    """A duration as its largest unit: 42s, 7m, 3h, 12d."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def letter_json(letter: DeadLetter) -> dict[str, Any]:
    """A letter as JSON values: its message's input as text where it is text, bytes as
    {"base64": ...} (or {"text": ...} for raw bytes that are UTF-8)."""
    envelope = None
    if letter.envelope is not None:
        envelope = _jsonable(letter.envelope.model_dump(mode="python", exclude={"input"}))
        envelope["input"] = _input_json(letter.envelope.input)
    raw: dict[str, str] | None = None
    if letter.raw is not None:
        try:
            raw = {"text": letter.raw.decode("utf-8")}
        except UnicodeDecodeError:
            raw = {"base64": base64.b64encode(letter.raw).decode("ascii")}
    return {
        "letter_id": letter.letter_id,
        "session_id": letter.session_id,
        "turn_id": letter.turn_id,
        "idempotency_key": letter.idempotency_key,
        "source_id": letter.source_id,
        "reason": letter.reason,
        "dead_at": letter.dead_at,
        "attempts": [
            {"attempt": a.attempt, "node": a.node, "error": a.error, "at": a.at}
            for a in letter.attempts
        ],
        "envelope": envelope,
        "raw": raw,
    }


def _input_json(value: UserInput) -> Any:
    """The input as one string when every part is text, else its parts."""
    if all(isinstance(part, TextPart) for part in value.parts):
        return value.as_text()
    return [_jsonable(part.model_dump(mode="python")) for part in value.parts]


def _jsonable(value: Any) -> Any:
    """Wire primitives as JSON values (bytes as {"base64": ...})."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
