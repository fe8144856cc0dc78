"""Retry policy for failed turns: how often, how far apart, and on which errors."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class TerminalError(Exception):
    """Raised by an agent for a failure no retry can fix: the turn fails at once, never retried."""


#: What decides whether an error is retried: exception types, or a predicate.
RetryOn = tuple[type[BaseException], ...] | Callable[[BaseException], bool]


class RetryPolicy(BaseModel):
    """Run a turn whose agent raised again, after a growing delay, up to `max_attempts` runs
    in all (the conventions of LangGraph's RetryPolicy and Temporal's activity retry policy).

    The n-th retry waits `initial_interval * backoff_factor ** (n - 1)`, at most
    `max_interval`, spread by +/- `jitter` (a fraction of the delay). `retry_on` names the
    errors that are retried (types, or a predicate); `TerminalError` never is.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    max_attempts: int = Field(default=3, ge=1, le=100)
    initial_interval: float = Field(default=1.0, gt=0)
    backoff_factor: float = Field(default=2.0, ge=1)
    max_interval: float = Field(default=60.0, gt=0)
    jitter: float = Field(default=0.1, ge=0, le=1)
    retry_on: RetryOn = (Exception,)

    @field_validator("retry_on", mode="before")
    @classmethod
    def _types_or_predicate(cls, value: Any) -> Any:
        # A single exception type is callable too: read it as the one type, not a predicate.
        if isinstance(value, type):
            value = (value,)
        if isinstance(value, tuple | list):
            if not value or not all(
                isinstance(t, type) and issubclass(t, BaseException) for t in value
            ):
                raise ValueError("must be exception types (at least one) or a predicate")
            return tuple(value)
        if not callable(value):
            raise ValueError("must be exception types or a predicate")
        return value

    @model_validator(mode="after")
    def _intervals(self) -> Self:
        if self.max_interval < self.initial_interval:
            raise ValueError("max_interval must not be shorter than initial_interval")
        return self

    def retries(self, error: BaseException) -> bool:
        """True when `error` may be retried under this policy (never a TerminalError)."""
        if isinstance(error, TerminalError):
            return False
        if isinstance(self.retry_on, tuple):
            return isinstance(error, self.retry_on)
        return bool(self.retry_on(error))

    def delay(self, failed_attempt: int) -> float:
        """Seconds to wait before the run after attempt `failed_attempt` (1-based)."""
        base = min(
            self.initial_interval * self.backoff_factor ** (failed_attempt - 1), self.max_interval
        )
        spread = base * self.jitter
        return max(0.0, base + random.uniform(-spread, spread))
