"""Log records that name their node, session and turn: the router, its actors and the backends
log through `get_logger`, which adds the fields of the current context as `extra` (see the
README, "Logs").

The fields live in context variables, so a task carries the fields of the code that started
it: a router starts its tasks as its node, an actor its tasks as its session, a turn as its
turn. Log lines name ids and codes, never message input or output text (that is logged only at
DEBUG, by code that says so).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator, MutableMapping
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

_NODE_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "stickless_node_id", default=None
)
_SESSION_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "stickless_session_id", default=None
)
_TURN_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "stickless_turn_id", default=None
)
_FIELDS = {"node_id": _NODE_ID, "session_id": _SESSION_ID, "turn_id": _TURN_ID}

#: The `extra` fields a record of stickless may carry.
CONTEXT_FIELDS = tuple(_FIELDS)


def current_fields() -> dict[str, str]:
    """The context's fields that are set."""
    fields: dict[str, str] = {}
    for name, var in _FIELDS.items():
        value = var.get()
        if value is not None:
            fields[name] = value
    return fields


def _set(fields: dict[str, str | None]) -> list[tuple[contextvars.ContextVar[str | None], Any]]:
    tokens = []
    for name, value in fields.items():
        var = _FIELDS[name]  # KeyError: not a context field (a programming error)
        tokens.append((var, var.set(value)))
    return tokens


@contextlib.contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    """Name these fields in every record logged (and every task started) inside the block."""
    tokens = _set(fields)
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def task_context(**fields: str | None) -> contextvars.Context:
    """A copy of the current context with these fields set: for a task to run in
    (`loop.create_task(coro, context=...)`), so it names them without changing the caller's."""
    context = contextvars.copy_context()
    context.run(_set, fields)
    return context


def bind(**fields: str | None) -> None:
    """Set the fields for the rest of the current task or thread (one that runs in a context of
    its own: a task, a thread)."""
    _set(fields)


class _Node(Protocol):
    @property
    def node_id(self) -> str: ...


_P = ParamSpec("_P")
_R = TypeVar("_R")
_N = TypeVar("_N", bound=_Node)


def as_node(
    method: Callable[Concatenate[_N, _P], Awaitable[_R]],
) -> Callable[Concatenate[_N, _P], Coroutine[Any, Any, _R]]:
    """A public coroutine method that logs (and starts its tasks) as its object's node."""

    @functools.wraps(method)
    async def in_node_context(self: _N, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with log_context(node_id=self.node_id):
            return await method(self, *args, **kwargs)

    return in_node_context


class ContextLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger whose records carry the context's fields (explicit `extra` wins)."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        extra = kwargs.get("extra")
        fields: dict[str, Any] = current_fields()
        if extra:
            fields.update(extra)
        kwargs["extra"] = fields
        return msg, kwargs


def get_logger(name: str) -> ContextLogger:
    return ContextLogger(logging.getLogger(name))


_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the context's fields and any
    other `extra`, and the exception when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool) else repr(value)
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    """The plain format, with the context's fields appended as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        named = [f"{key}={getattr(record, key)}" for key in CONTEXT_FIELDS if hasattr(record, key)]
        return f"{text} [{' '.join(named)}]" if named else text


_OURS = "_stickless_cli_handler"


def configure_logging(log_format: str = "text", level: int = logging.WARNING) -> None:
    """Log to stderr as text lines (time, level, logger, message, [fields]) or JSON lines.

    Raises:
        ValueError: the format is neither 'text' nor 'json'.
    """
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    elif log_format == "text":
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        raise ValueError(f"log format must be 'text' or 'json', not {log_format!r}")
    root = logging.getLogger()
    # Replace only a handler an earlier call installed: one the embedding program (or a test
    # runner) put on the root logger stays.
    for old in [h for h in root.handlers if getattr(h, _OURS, False)]:
        root.removeHandler(old)
    setattr(handler, _OURS, True)
    root.addHandler(handler)
    root.setLevel(level)
