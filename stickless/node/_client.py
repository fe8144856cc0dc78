"""Client of a node process's loopback server (used by tests, benchmarks and tools)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from .._errors import RouterClosedError
from .._events import Event
from .._types import CommittedEntry, SubmitRequest, TurnResult
from ..router import StreamGap, TurnInfo
from ..wire import GapNotice, WireError, event_from_payload
from ._protocol import encode_frame, read_frame
from ._service import error_from_wire


class NodeClient:
    """One connection to a node; calls may run concurrently over it.

    When the connection drops, every pending call raises RouterClosedError.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, RemoteEventStream] = {}
        self._lock = asyncio.Lock()
        self._closed = False
        self._reader_task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, port: int, host: str = "127.0.0.1") -> NodeClient:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def aclose(self) -> None:
        self._closed = True
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader_task

    async def _send(self, frame: dict[str, Any]) -> None:
        if self._closed:
            raise RouterClosedError("node connection closed")
        async with self._lock:
            try:
                self._writer.write(encode_frame(frame))
                await self._writer.drain()
            except ConnectionError as exc:
                raise RouterClosedError(f"node connection lost: {exc}") from None

    async def _read(self) -> None:
        try:
            while True:
                frame = await read_frame(self._reader)
                if frame is None:
                    break
                request_id = frame.get("id")
                if not isinstance(request_id, int):
                    continue
                stream = self._streams.get(request_id)
                if stream is not None:
                    if "ok" in frame:
                        del self._streams[request_id]
                    stream._deliver(frame)
                    continue
                future = self._calls.pop(request_id, None)
                if future is None or future.done():
                    continue
                if frame.get("ok"):
                    future.set_result(frame.get("value"))
                else:
                    future.set_exception(error_from_wire(frame.get("error") or {}))
        except (ConnectionError, asyncio.IncompleteReadError, WireError):
            pass
        finally:
            self._closed = True
            lost = RouterClosedError("node connection lost")
            for future in self._calls.values():
                if not future.done():
                    future.set_exception(lost)
            self._calls.clear()
            for stream in self._streams.values():
                stream._deliver({"ok": False, "error": {"type": "RouterClosedError"}})
            self._streams.clear()

    async def call(self, op: str, **args: Any) -> Any:
        """Send one request and await its answer (raising the error it carried)."""
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[request_id] = future
        try:
            await self._send({"id": request_id, "op": op, "args": args})
        except BaseException:
            self._calls.pop(request_id, None)
            raise
        return await future

    async def submit(self, request: SubmitRequest | Mapping[str, Any]) -> dict[str, Any]:
        """Submit on the node; returns the ticket {kind, turn_id, node_id, session_id}."""
        payload = (
            request.model_dump(mode="python") if isinstance(request, SubmitRequest) else request
        )
        ticket: dict[str, Any] = await self.call("submit", request=payload)
        return ticket

    async def result(
        self,
        turn_id: str,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the API's bound)
    ) -> TurnResult:
        """Await a turn: with `session_id` any turn of the cluster, else one submitted on this
        node (raises TurnFailedError when it failed; see NodeService.result)."""
        answer = await self.call("result", turn_id=turn_id, session_id=session_id, timeout=timeout)
        return TurnResult.model_validate(answer)

    async def turn(self, session_id: str, turn_id: str) -> TurnInfo:
        """The turn's state and answer, from any node (see SessionRouter.turn)."""
        return TurnInfo.model_validate(
            await self.call("turn", session_id=session_id, turn_id=turn_id)
        )

    async def transcript(self, session_id: str) -> list[CommittedEntry]:
        """The session's committed transcript (see SessionRouter.transcript)."""
        entries = await self.call("transcript", session_id=session_id)
        return [CommittedEntry.model_validate(entry) for entry in entries]

    async def stream(self, request: SubmitRequest | Mapping[str, Any]) -> RemoteEventStream:
        """Submit on the node and follow that turn's frames (see SessionRouter.stream); the
        stream's `ticket` is the submit's.

        Raises:
            the errors of `submit` (nothing is streamed then).
        """
        payload = (
            request.model_dump(mode="python") if isinstance(request, SubmitRequest) else request
        )
        request_id = next(self._ids)
        stream = RemoteEventStream(self, request_id)
        self._streams[request_id] = stream
        await self._send({"id": request_id, "op": "stream", "args": {"request": payload}})
        await stream.ready()
        if stream.ticket is None:  # refused: the stream ended with the submit's error
            await stream.__anext__()
        return stream

    async def run(self, request: SubmitRequest | Mapping[str, Any]) -> TurnResult:
        ticket = await self.submit(request)
        return await self.result(str(ticket["turn_id"]))

    async def interrupt(
        self, session_id: str, reason: str = "USER", turn_id: str | None = None
    ) -> bool:
        """Whether a turn was interrupted or cancelled (see SessionRouter.interrupt)."""
        return bool(
            await self.call("interrupt", session_id=session_id, reason=reason, turn_id=turn_id)
        )

    async def release_session(self, session_id: str) -> None:
        await self.call("release_session", session_id=session_id)

    async def delete_session(self, session_id: str) -> None:
        await self.call("delete_session", session_id=session_id)

    async def status(self, session_id: str) -> dict[str, Any]:
        status: dict[str, Any] = await self.call("status", session_id=session_id)
        return status

    async def ping(self) -> str:
        answer = await self.call("ping")
        return str(answer["node_id"])

    async def events(
        self, session_id: str, turn_id: str | None = None, after: str | None = None
    ) -> RemoteEventStream:
        """Subscribe to the session's frames on the node (see SessionRouter.events)."""
        request_id = next(self._ids)
        stream = RemoteEventStream(self, request_id)
        self._streams[request_id] = stream
        await self._send(
            {
                "id": request_id,
                "op": "events",
                "args": {"session_id": session_id, "turn_id": turn_id, "after": after},
            }
        )
        return stream

    async def _cancel(self, request_id: int) -> None:
        if self._streams.pop(request_id, None) is not None and not self._closed:
            with contextlib.suppress(RouterClosedError):
                await self._send(
                    {"id": next(self._ids), "op": "cancel", "args": {"target": request_id}}
                )


class RemoteEventStream:
    """Frames of one `events` (or `stream`) subscription on a node, and the gaps it met
    (`take_gaps()`); `await ready()` before relying on it."""

    def __init__(self, client: NodeClient, request_id: int) -> None:
        self._client = client
        self._request_id = request_id
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: The submit's ticket, for a `stream` subscription (None for `events`).
        self.ticket: dict[str, Any] | None = None
        self._gaps: list[StreamGap] = []

    def _deliver(self, frame: dict[str, Any]) -> None:
        if frame.get("ready"):
            ticket = frame.get("ticket")
            if isinstance(ticket, dict):
                self.ticket = ticket
            if not self._ready.done():
                self._ready.set_result(None)
            return
        if "event" in frame:
            self._queue.put_nowait(("event", frame["event"]))
            return
        if "gap" in frame:
            self._queue.put_nowait(("gap", frame["gap"]))
            return
        if not self._ready.done():
            self._ready.set_result(None)
        self._queue.put_nowait(("end", frame))  # a clean end, or an error

    async def ready(self) -> None:
        await asyncio.shield(self._ready)

    def __aiter__(self) -> RemoteEventStream:
        return self

    def take_gaps(self) -> list[StreamGap]:
        """The gaps the node's stream met since the last call (each lies before the next frame
        yielded; see `EventStream.take_gaps`)."""
        gaps, self._gaps = self._gaps, []
        return gaps

    async def __anext__(self) -> Event:
        kind, item = await self._queue.get()
        while kind == "gap":
            self._gaps.append(_gap(item))
            kind, item = await self._queue.get()
        if kind == "event":
            return event_from_payload(item)
        self._queue.put_nowait((kind, item))  # stay ended for later calls
        if item.get("ok"):
            raise StopAsyncIteration
        raise error_from_wire(item.get("error") or {})

    async def aclose(self) -> None:
        await self._client._cancel(self._request_id)


def _gap(raw: object) -> StreamGap:
    """A gap frame's gap; one that does not read as a gap is still one (where it lies is then
    not known)."""
    try:
        notice = GapNotice.model_validate(raw)
    except ValidationError:
        return StreamGap(None, None)
    return StreamGap(notice.cursor, notice.oldest_id)
