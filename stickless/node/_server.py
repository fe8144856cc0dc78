"""Loopback server exposing a NodeService to other processes (tests, benchmarks, tools).

Requests are `{"id", "op", "args"}`; answers are `{"id", "ok": True, "value"}` or
`{"id", "ok": False, "error"}`; the `events` op answers `{"id", "ready": True}` once subscribed,
streams `{"id", "event"}` frames, a `{"id", "gap": {"cursor", "oldest_id"}}` frame where the
stream met a gap (frames the event log no longer held when it caught up), and ends with
`{"id", "ok": True, "value": None}`; the `stream` op does the same once submitted, its ready
frame carrying the ticket.
Requests on one connection run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from .._errors import InvalidRequestError
from .._logs import get_logger
from ..router import EventStream, StreamGap, TurnStream, with_gaps
from ..wire import GapNotice, WireError
from ._protocol import encode_frame, read_frame
from ._service import NodeService, error_to_wire, ticket_of

log = get_logger("stickless.node")


class NodeServer:
    """Serves one node's NodeService on 127.0.0.1."""

    def __init__(self, service: NodeService, host: str = "127.0.0.1", port: int = 0) -> None:
        self.service = service
        self._host = host
        self._port = port
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.shutdown_requested = asyncio.Event()

    async def start(self) -> int:
        """Listen; returns the bound port."""
        self._server = await asyncio.start_server(self._serve, self._host, self._port)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def aclose(self) -> None:
        """Stop listening and close every connection (their pending requests are cancelled)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._connections:
            await asyncio.wait(self._connections, timeout=2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._writers.add(writer)
        lock = asyncio.Lock()
        running: dict[int, asyncio.Task[None]] = {}

        async def send(frame: dict[str, Any]) -> None:
            async with lock:
                writer.write(encode_frame(frame))
                await writer.drain()

        try:
            while True:
                try:
                    frame = await read_frame(reader)
                except WireError as exc:
                    log.warning("dropping connection after a bad frame: %s", exc)
                    return
                if frame is None:
                    return
                request_id = frame.get("id")
                if not isinstance(request_id, int):
                    continue
                if frame.get("op") == "cancel":
                    target = running.get(int(frame.get("args", {}).get("target", -1)))
                    if target is not None:
                        target.cancel()
                    continue
                handler = self._dispatch(request_id, frame, send)
                job = asyncio.ensure_future(handler)
                running[request_id] = job
                job.add_done_callback(_forget(running, request_id))
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            for job in list(running.values()):
                job.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._connections.discard(task)
            self._writers.discard(writer)

    async def _dispatch(
        self,
        request_id: int,
        frame: dict[str, Any],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        op = frame.get("op")
        args = frame.get("args") or {}
        service = self.service
        try:
            if not isinstance(args, dict):
                raise InvalidRequestError("args: must be a map")
            if op == "events":
                stream = service.router.events(
                    str(args["session_id"]), args.get("turn_id"), args.get("after")
                )
                await _relay(request_id, stream, send, {})
                value: Any = None
            elif op == "stream":
                turn_stream = await service.stream(args["request"])
                await _relay(
                    request_id, turn_stream, send, {"ticket": ticket_of(turn_stream.disposition)}
                )
                value = None
            elif op == "submit":
                value = await service.submit(args["request"])
            elif op == "result":
                session_id = args.get("session_id")
                value = await service.result(
                    str(args["turn_id"]),
                    None if session_id is None else str(session_id),
                    _timeout(args.get("timeout")),
                )
            elif op == "turn":
                value = await service.turn(str(args["session_id"]), str(args["turn_id"]))
            elif op == "transcript":
                value = await service.transcript(str(args["session_id"]))
            elif op == "run":
                value = await service.run(args["request"])
            elif op == "interrupt":
                value = await service.interrupt(
                    str(args["session_id"]), str(args.get("reason", "USER")), args.get("turn_id")
                )
            elif op == "release_session":
                await service.release_session(str(args["session_id"]))
                value = None
            elif op == "delete_session":
                await service.delete_session(str(args["session_id"]))
                value = None
            elif op == "status":
                value = await service.status(str(args["session_id"]))
            elif op == "ping":
                value = {"node_id": service.router.node_id}
            elif op == "shutdown":
                self.shutdown_requested.set()
                value = None
            else:
                raise InvalidRequestError(f"op: unknown operation {op!r}")
        except asyncio.CancelledError:
            return
        except KeyError as exc:
            await send(
                {
                    "id": request_id,
                    "ok": False,
                    "error": error_to_wire(InvalidRequestError(f"{exc.args[0]}: required")),
                }
            )
            return
        except Exception as exc:
            await send({"id": request_id, "ok": False, "error": error_to_wire(exc)})
            return
        await send({"id": request_id, "ok": True, "value": value})


async def _relay(
    request_id: int,
    stream: EventStream | TurnStream,
    send: Callable[[dict[str, Any]], Awaitable[None]],
    ready: dict[str, Any],
) -> None:
    """Send the ready frame (with `ready`'s fields) once the stream is ready, then its frames
    and the gaps it met, each where it lies; the stream is closed in the end."""
    try:
        if isinstance(stream, EventStream):
            await stream.ready()
        await send({"id": request_id, "ready": True, **ready})
        async for item in with_gaps(stream):
            if isinstance(item, StreamGap):
                gap = GapNotice(cursor=item.cursor, oldest_id=item.oldest_id)
                await send({"id": request_id, "gap": gap.model_dump(mode="python")})
            else:
                await send({"id": request_id, "event": item.model_dump(mode="json")})
    finally:
        await stream.aclose()


def _timeout(raw: object) -> float | None:
    """A `timeout` argument: None, or a number of seconds.

    Raises:
        InvalidRequestError: it is neither.
    """
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise InvalidRequestError("timeout: must be a number of seconds or null")
    return float(raw)


def _forget(
    running: dict[int, asyncio.Task[None]], request_id: int
) -> Callable[[asyncio.Task[None]], None]:
    def done(_: asyncio.Task[None]) -> None:
        running.pop(request_id, None)

    return done
