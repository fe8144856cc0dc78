"""Plumbing every router part shares: background tasks, per-session locks, backend call wrappers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from .._errors import SticklessError
from .._logs import get_logger, task_context
from .._store_errors import store_error
from ..backends.base import FencedOut
from ._loops import LoopHealth, next_pause

log = get_logger("stickless.router")

T = TypeVar("T")

#: Backoff of writes retried while the store is out of reach (seconds).
RETRY_FIRST = 0.05
RETRY_CAP = 1.0


async def io(awaitable: Awaitable[T]) -> T:
    """Await a backend call; failures other than ours surface as BackendUnavailableError (an
    outage) or InternalError (a refusal no retry changes: see stickless/_store_errors.py)."""
    try:
        return await awaitable
    except (SticklessError, FencedOut):
        raise
    except Exception as exc:
        raise store_error(exc) from exc


async def quiet(awaitable: Awaitable[T]) -> T | None:
    """Await a best-effort backend call; failures are logged, None returned."""
    try:
        return await awaitable
    except Exception as exc:
        log.warning("best-effort backend call failed: %s", exc)
        return None


async def patiently(
    call: Callable[[], Awaitable[T]], within: float, bg: Background
) -> tuple[T] | None:
    """Run a store call until it answers, for up to `within` seconds while the store is out of
    reach (the call must be safe to repeat): its reply, or None when it never answered (or the
    router closes meanwhile).

    Raises:
        FencedOut: the call was refused by the record's fence (an answer, not an outage).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    delay = RETRY_FIRST
    while True:
        try:
            return (await call(),)
        except FencedOut:
            raise
        except Exception as exc:
            log.warning("store call failed, retrying: %s", exc)
        if loop.time() + delay >= deadline or bg.closed:
            return None
        await asyncio.sleep(delay)
        delay = min(delay * 2, RETRY_CAP)


class KeyedLocks:
    """One asyncio lock per session, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class Background:
    """The node's background work: supervised loops and one-off tasks, stopped together."""

    def __init__(self, node_id: str, on_loop_failure: Callable[[str], None] | None = None) -> None:
        #: Every task starts as this node's (see stickless/_logs.py).
        self._node_id = node_id
        #: Told the name of a loop each time one of its rounds fails (the metric).
        self._on_loop_failure = on_loop_failure or (lambda name: None)
        #: Set once the router stops accepting work (closing or killed); parts check it.
        self.closed = False
        self.health = LoopHealth()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()

    def start_loop(
        self,
        name: str,
        interval: float,
        work: Callable[[], Awaitable[None]],
        *,
        at_once: bool = False,
    ) -> None:
        """Run `work` every `interval` seconds (the first round `at_once`, else after one
        interval) until the router stops, supervised (see `_supervise`)."""
        task = asyncio.get_running_loop().create_task(
            self._supervise(name, interval, work, at_once),
            name=f"loop:{name}",
            context=task_context(node_id=self._node_id),
        )
        task.add_done_callback(functools.partial(self._loop_ended, name))
        self._loops.append(task)

    async def _supervise(
        self, name: str, interval: float, work: Callable[[], Awaitable[None]], at_once: bool
    ) -> None:
        """A round that raises is logged with its traceback and counted, and the loop goes on
        after a backoff; failing rounds in a row make it failing (`health`) until one succeeds
        (see stickless/router/_loops.py)."""
        if not at_once and not await self.pause(interval):
            return
        while True:
            try:
                await work()
            except Exception as exc:
                failures = self.health.failed(name, exc)
                pause = next_pause(interval, failures)
                log.error(
                    "background loop %s failed (%d round(s) in a row); it runs again in %.2fs",
                    name,
                    failures,
                    pause,
                    exc_info=exc,
                )
                self._on_loop_failure(name)
            else:
                self.health.succeeded(name)
                pause = interval
            if not await self.pause(pause):
                return

    def _loop_ended(self, name: str, task: asyncio.Task[None]) -> None:
        """A loop's task ended: unless the router stops it, it died (a BaseException), and the
        node reports it failing for good."""
        if task.cancelled() or self._stopping.is_set():
            return
        error = task.exception()
        log.error("background loop %s stopped", name, exc_info=error)
        self.health.stopped(name, error)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "") -> None:
        """Run a one-off task; its failure is logged, never raised into the caller."""
        task = asyncio.get_running_loop().create_task(
            coro, name=name or None, context=task_context(node_id=self._node_id)
        )
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    async def pause(self, seconds: float) -> bool:
        """Sleep between rounds of a loop; False once the router is stopping."""
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            return True
        return False

    async def stop(self) -> None:
        """Let the loops finish their round (no backend call is cut off mid-flight, which
        would leave its connection half-open), then cancel whatever is still running."""
        self._stopping.set()
        running = [*self._loops, *self._tasks]
        if running:
            await asyncio.wait(running, timeout=2.0)
        await self._cancel_and_wait(wait_for=2.0)

    def cancel(self) -> None:
        """Crash path: cancel everything at once, before any await."""
        for task in [*self._loops, *self._tasks]:
            task.cancel()

    async def _cancel_and_wait(self, wait_for: float) -> None:
        self.cancel()
        pending = [*self._loops, *self._tasks]
        if pending:
            await asyncio.wait(pending, timeout=wait_for)
        self._loops.clear()

    async def wait_cancelled(self) -> None:
        """Crash path: give the cancelled tasks a moment to unwind."""
        await self._cancel_and_wait(wait_for=1.0)
