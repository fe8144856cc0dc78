"""W3C trace context for turns: the caller's `traceparent` travels with the submit to the node
that runs the turn, and every frame of the turn names the turn's trace and span (see
docs/architecture.md, "Trace context").

With `opentelemetry-api` installed and an SDK configured, submit, forward and turn are real
spans; otherwise the same ids are generated here, so frames carry a trace either way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr, field_validator

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_SAMPLED = 0x01


class TraceContext(BaseModel):
    """A position in a distributed trace: the trace and the span a child span hangs under.

    Raises:
        ValueError: the ids are not lowercase hex of the W3C lengths, or all zeros.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    trace_id: StrictStr
    span_id: StrictStr
    sampled: StrictBool = True

    @field_validator("trace_id")
    @classmethod
    def _trace_id(cls, value: str) -> str:
        if not _TRACE_ID.fullmatch(value) or value == "0" * 32:
            raise ValueError("must be 32 lowercase hex digits, not all zero")
        return value

    @field_validator("span_id")
    @classmethod
    def _span_id(cls, value: str) -> str:
        if not _SPAN_ID.fullmatch(value) or value == "0" * 16:
            raise ValueError("must be 16 lowercase hex digits, not all zero")
        return value

    @classmethod
    def from_traceparent(cls, header: str) -> TraceContext:
        """Parse a W3C `traceparent` (version 00, or a later version's first four fields).

        Raises:
            ValueError: the header is not a valid traceparent (the message says why).
        """
        match = _TRACEPARENT.fullmatch(header.strip())
        if match is None:
            raise ValueError("traceparent must be 'VV-<32 hex trace id>-<16 hex span id>-FF'")
        version, trace_id, span_id, flags, rest = match.groups()
        if version == "ff" or (version == "00" and rest):
            raise ValueError(f"traceparent version {version} does not allow this form")
        return cls(trace_id=trace_id, span_id=span_id, sampled=bool(int(flags, 16) & _SAMPLED))

    @classmethod
    def lenient(cls, header: str | None) -> TraceContext | None:
        """The header's context, or None when it is missing or invalid: the W3C rule for a
        receiver, which then starts a new trace."""
        if not header:
            return None
        try:
            return cls.from_traceparent(header)
        except ValueError:
            return None

    @property
    def traceparent(self) -> str:
        flags = _SAMPLED if self.sampled else 0
        return f"00-{self.trace_id}-{self.span_id}-{flags:02x}"

    def child(self) -> TraceContext:
        """A new span in the same trace."""
        return _made(self.trace_id, new_span_id(), self.sampled)


def new_trace_id() -> str:
    return os.urandom(16).hex()


def new_span_id() -> str:
    return os.urandom(8).hex()


def _made(trace_id: str, span_id: str, sampled: bool) -> TraceContext:
    """A context of ids made here or by a valid OpenTelemetry span: valid by construction, so
    not validated again (a submit and a turn each make one)."""
    return TraceContext.model_construct(trace_id=trace_id, span_id=span_id, sampled=sampled)


def _of_span(ids: Any) -> TraceContext:
    """The context of a valid OpenTelemetry `SpanContext`."""
    return _made(
        format(ids.trace_id, "032x"), format(ids.span_id, "016x"), bool(ids.trace_flags & _SAMPLED)
    )


def coerce_trace(value: Any) -> Any:
    """A `traceparent` string as a TraceContext (other values go on to normal validation).

    Raises:
        ValueError: the string is not a valid traceparent.
    """
    if isinstance(value, str):
        return TraceContext.from_traceparent(value)
    return value


class Span(Protocol):
    """One started span: its context (for frames and children) and its end."""

    @property
    def context(self) -> TraceContext: ...

    def end(self, attributes: Mapping[str, str | int | bool] | None = None) -> None: ...


@dataclass(slots=True)
class _IdSpan:
    """A span that only has ids (no OpenTelemetry SDK records it)."""

    context: TraceContext

    def end(self, attributes: Mapping[str, str | int | bool] | None = None) -> None:
        return None


class _OtelSpan:
    """An OpenTelemetry span whose ids are also the frames' ids."""

    __slots__ = ("_span", "context")

    def __init__(self, span: Any, context: TraceContext) -> None:
        self._span = span
        self.context = context

    def end(self, attributes: Mapping[str, str | int | bool] | None = None) -> None:
        if attributes:
            self._span.set_attributes(dict(attributes))
        self._span.end()


class Tracing:
    """Starts the spans of submits, forwards and turns: OpenTelemetry's when it records them,
    else id-only spans with the same parentage."""

    def __init__(self, tracer_provider: Any | None = None) -> None:
        #: The provider's tracer, looked up at first use (None: the global provider's).
        self._provider = tracer_provider
        self._tracer: Any = None
        try:
            from opentelemetry import trace
        except ImportError:  # the `otel` extra is not installed
            self._otel: Any = None
        else:
            self._otel = trace

    def start(
        self,
        name: str,
        parent: TraceContext | None,
        attributes: Mapping[str, str | int | bool],
        *,
        ambient: bool = False,
    ) -> Span:
        """A child span of `parent`; with no parent, of the caller's current OpenTelemetry span
        when `ambient` (a submit), else the root of a new trace. Never raises.

        With `ambient`, a current span of the parent's own trace is the parent instead: an
        instrumented HTTP server's span sits between the request's traceparent and the submit.
        """
        if self._otel is not None:
            current = self._current() if ambient else None
            in_current = current is not None and (
                parent is None or current.trace_id == parent.trace_id
            )
            if in_current:
                parent = current
            try:
                span = self._start_otel(
                    name, None if in_current else parent, attributes, in_current
                )
            except Exception:  # a broken tracer provider must not fail a turn
                span = None
            if span is not None:
                return span
        if parent is not None:
            return _IdSpan(parent.child())
        return _IdSpan(_made(new_trace_id(), new_span_id(), True))

    def _current(self) -> TraceContext | None:
        """The caller's current OpenTelemetry span as a parent (None: there is none)."""
        try:
            ids = self._otel.get_current_span().get_span_context()
        except Exception:
            return None
        return _of_span(ids) if ids.is_valid else None

    def _start_otel(
        self,
        name: str,
        parent: TraceContext | None,
        attributes: Mapping[str, str | int | bool],
        in_current: bool = False,
    ) -> _OtelSpan | None:
        trace = self._otel
        context: Any = None  # in_current: the current context, whose span is the parent
        if parent is not None:
            remote = trace.SpanContext(
                trace_id=int(parent.trace_id, 16),
                span_id=int(parent.span_id, 16),
                is_remote=True,
                trace_flags=trace.TraceFlags(_SAMPLED if parent.sampled else 0),
            )
            context = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        elif not in_current:
            from opentelemetry.context import Context

            context = Context()  # a root: never whatever span the task happened to start under
        if self._tracer is None:
            self._tracer = trace.get_tracer("stickless", tracer_provider=self._provider)
        span = self._tracer.start_span(name, context=context, attributes=dict(attributes))
        ids = span.get_span_context()
        if not span.is_recording() or not ids.is_valid:
            span.end()
            return None
        return _OtelSpan(span, _of_span(ids))
