"""`FaultProxy`: a loopback TCP proxy between Redis clients and `redis-server` that injects
faults at exact points of the conversation.

The proxy runs in its own thread with its own asyncio event loop, so it keeps working while
the test's loop is busy or blocked, and serves separate node processes as well as in-process
clients. Point a client at `proxy.url()` instead of the server's URL.

It cuts both byte streams into RESP frames (see `resp.py`) and pairs, per connection and in
order, every server reply with the client command it answers. That is what lets a rule act on
"the reply to the EVALSHA of `inbox_deliver`": a script is named by its stickless name (the
proxy knows the SHA1 of every `stickless/backends/redis/lua/*.lua` as redis-py sends it).
Once a connection subscribes (SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE; also MONITOR and CLIENT
REPLY) the server pushes frames that answer no command, so pairing stops there for good: that
connection then only suffers whole-connection faults (stall, delay, reset). RESP3 pushes (`>`)
are never paired on any connection.

Faults (every method may be called from any thread; each returns a `Fault` whose `fired`
event, `wait()` and `await wait_fired()` tell when it actually took effect):

- `cut_after`: the command reaches the server and runs; its reply is dropped and the
  connection reset (nothing pipelined after it is forwarded). The server applied the write,
  the client never learns it.
- `cut_before`: the connection is reset when the command is seen; it never reaches the server.
- `hold_reply`: the command runs; its reply, and everything after it on that connection, is
  held for a while, then delivered in order.
- `stall` / `delay`: hold bytes of one or both directions until released (or for a while), or
  add latency to every frame; for every connection, only those that sent a given command, or
  only those of one client name (CLIENT SETNAME: one pool of a client, e.g. a node's command
  pool but not its renewer's or its pub/sub connection).
- `reset_all`, `refuse_new`: abort every open connection now; reset new ones as they arrive.
- `reset_connections`: abort only the connections that subscribed (a pub/sub-only cut), or
  only those that did not (a command-only cut).

A reset sets SO_LINGER 0 before closing, so the peer sees ECONNRESET, not a clean EOF. EVALSHA
answered NOSCRIPT never ran, so it does not count as a match of `cut_after` / `hold_reply`
(redis-py then loads the script and sends the EVALSHA again, and that one matches).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from types import TracebackType
from typing import Any, ClassVar, Literal, cast

from .resp import ProtocolError, ReplyInfo, frame_end, parse_command, reply_info

Direction = Literal["to_server", "to_client", "both"]
_Way = Literal["to_server", "to_client"]
TO_SERVER: _Way = "to_server"
TO_CLIENT: _Way = "to_client"

#: Default bound of every wait helper (well under the 60 s per-test timeout).
WAIT_TIMEOUT = 10.0
#: Queued bytes of one direction above which the proxy stops reading its source (and below
#: which it reads again): a stalled direction holds bytes in the kernel beyond that.
_HIGH_WATER = 8 * 1024 * 1024
_LOW_WATER = 1024 * 1024
#: Commands after which the server sends frames that answer no command.
_UNPAIRED_COMMANDS = frozenset(
    {"SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "MONITOR", "SYNC", "PSYNC"}
)
_EVALSHA = frozenset({"EVALSHA", "EVALSHA_RO"})
_EVAL = frozenset({"EVAL", "EVAL_RO"})


# --------------------------------------------------------------------------- scripts


def stickless_scripts() -> dict[str, str]:
    """SHA1 (hex, as redis-py computes it for `register_script`) -> name of every stickless
    Lua script, from the package's `lua/` directory."""
    from stickless.backends.redis._scripts import source

    lua = files("stickless.backends.redis").joinpath("lua")
    names = sorted(
        entry.name[: -len(".lua")]
        for entry in lua.iterdir()
        if entry.name.endswith(".lua") and not entry.name.startswith("_")
    )
    return {hashlib.sha1(source(name).encode("utf-8")).hexdigest(): name for name in names}


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Command:
    """One command a client sent through the proxy."""

    conn_id: int
    #: Position among the commands of its connection (0 first).
    seq: int
    args: tuple[bytes, ...]
    #: Upper-case command name ("EVALSHA", "SET", ...).
    name: str
    #: Stickless script name for EVAL/EVALSHA of a known script, else None.
    script: str | None
    #: SHA1 of the script for EVAL/EVALSHA, else None.
    sha: str | None


@dataclass(frozen=True, slots=True)
class FiredFault:
    """One time a fault took effect."""

    kind: str
    conn_id: int
    #: The command it acted on (None for whole-connection faults).
    command: str | None
    script: str | None
    #: `time.monotonic()` when it fired.
    at: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """A snapshot of one open proxied connection."""

    conn_id: int
    #: The client's port on 127.0.0.1.
    client_port: int
    #: Commands seen from the client so far.
    commands: int
    #: True once it subscribed (or otherwise left request/reply mode): no pairing any more.
    unpaired: bool
    #: The name it gave itself (CLIENT SETNAME), if any.
    name: str | None
    #: EOF came from the client / from the server (the other direction may still flow).
    eof_from_client: bool
    eof_from_server: bool


@dataclass(frozen=True, slots=True)
class Selector:
    """Which commands a rule applies to: all given criteria must hold (none given: every
    command). `script` is a stickless script name (EVAL/EVALSHA of it); `match` a predicate
    over the raw argument list (`args[0]` is the command name as sent)."""

    command: str | None = None
    script: str | None = None
    match: Callable[[Sequence[bytes]], bool] | None = None

    def matches(self, cmd: Command) -> bool:
        if self.command is not None and cmd.name != self.command.upper():
            return False
        if self.script is not None and cmd.script != self.script:
            return False
        return self.match is None or bool(self.match(cmd.args))

    @property
    def everything(self) -> bool:
        return self.command is None and self.script is None and self.match is None


# --------------------------------------------------------------------------- signals


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Signal:
    """A thread-safe counter that threads and event loops (any number, any thread) can wait on
    reaching a value; waking an event loop is done with `call_soon_threadsafe`, not polling."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0
        self.event = threading.Event()
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def count(self) -> int:
        with self._cond:
            return self._count

    def bump(self) -> None:
        with self._cond:
            self._count += 1
            self.event.set()
            self._cond.notify_all()
            ready = [w for w in self._waiters if w[0] <= self._count]
            self._waiters = [w for w in self._waiters if w[0] > self._count]
        for _, loop, future in ready:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, future)

    def wait(self, count: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._count >= count, timeout)

    async def wait_async(self, count: int, within: float) -> bool:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (count, loop, future)
        with self._cond:
            if self._count >= count:
                return True
            self._waiters.append(entry)
        try:
            async with asyncio.timeout(within):
                await future
            return True
        except TimeoutError:
            return False
        finally:
            with self._cond, contextlib.suppress(ValueError):
                self._waiters.remove(entry)


# --------------------------------------------------------------------------- faults


class Fault:
    """One armed fault. `fired` is set the first time it takes effect; `count` counts how
    often it did; `events` lists each time."""

    kind: ClassVar[str] = "fault"

    def __init__(self, proxy: FaultProxy, selector: Selector, times: int | None) -> None:
        if times is not None and times < 1:
            raise ValueError("times must be at least 1 (or None: unlimited)")
        self._proxy = proxy
        self.selector = selector
        #: How many more times it may fire (None: unlimited); guarded by the proxy's lock.
        self._remaining = times
        self._cancelled = False
        self._signal = _Signal()
        self._events: list[FiredFault] = []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.selector} fired={self.count}>"

    @property
    def fired(self) -> threading.Event:
        """Set once the fault has taken effect at least once."""
        return self._signal.event

    @property
    def count(self) -> int:
        """How many times it took effect."""
        return self._signal.count

    @property
    def events(self) -> list[FiredFault]:
        with self._proxy._lock:
            return list(self._events)

    @property
    def armed(self) -> bool:
        """Not cancelled and not used up."""
        with self._proxy._lock:
            return self._armed_locked()

    def _armed_locked(self) -> bool:
        return not self._cancelled and (self._remaining is None or self._remaining > 0)

    def wait(self, count: int = 1, timeout: float = WAIT_TIMEOUT) -> None:
        """Block the calling thread until it fired `count` times.

        Raises:
            TimeoutError: it did not within `timeout` seconds.
        """
        if not self._signal.wait(count, timeout):
            raise TimeoutError(f"{self!r} did not fire {count} time(s) within {timeout}s")

    async def wait_fired(self, count: int = 1, within: float = WAIT_TIMEOUT) -> None:
        """Wait (without blocking the loop) until it fired `count` times.

        Raises:
            TimeoutError: it did not within `within` seconds.
        """
        if not await self._signal.wait_async(count, within):
            raise TimeoutError(f"{self!r} did not fire {count} time(s) within {within}s")

    def cancel(self) -> None:
        """Disarm it (a stall or hold in progress is released)."""
        with self._proxy._lock:
            self._cancelled = True
        self._proxy._poke()


class CutAfter(Fault):
    """Forward the command, drop its reply and reset the connection."""

    kind = "cut_after"


class CutBefore(Fault):
    """Reset the connection instead of forwarding the command."""

    kind = "cut_before"


class _Releasable(Fault):
    """A fault that holds bytes until `release()` (or its time is up)."""

    def __init__(
        self, proxy: FaultProxy, selector: Selector, times: int | None, seconds: float | None
    ) -> None:
        super().__init__(proxy, selector, times)
        if seconds is not None and seconds < 0:
            raise ValueError("seconds must not be negative")
        self.seconds = seconds

    def release(self) -> None:
        """Deliver everything held, in order, and disarm."""
        self.cancel()


class HoldReply(_Releasable):
    """Forward the command, hold its reply (and all after it on that connection)."""

    kind = "hold_reply"

    def __init__(
        self, proxy: FaultProxy, selector: Selector, times: int | None, seconds: float | None
    ) -> None:
        super().__init__(proxy, selector, times, seconds)
        self._delivered = _Signal()
        self._delivered_at: list[float] = []

    @property
    def delivered_at(self) -> list[float]:
        """`time.monotonic()` of each held reply's delivery, in order."""
        with self._proxy._lock:
            return list(self._delivered_at)

    @property
    def delivered(self) -> threading.Event:
        """Set once a held reply has been delivered to the client."""
        return self._delivered.event

    async def wait_delivered(self, count: int = 1, within: float = WAIT_TIMEOUT) -> None:
        """Wait until `count` held replies went out to their clients.

        Raises:
            TimeoutError: they did not within `within` seconds.
        """
        if not await self._delivered.wait_async(count, within):
            raise TimeoutError(f"{self!r} delivered fewer than {count} within {within}s")


class _Gate(_Releasable):
    """A stall or delay of one or both directions, for every connection or selected ones."""

    def __init__(
        self,
        proxy: FaultProxy,
        selector: Selector,
        direction: Direction,
        seconds: float | None,
        client: str | None = None,
    ) -> None:
        if direction not in ("to_server", "to_client", "both"):
            raise ValueError(f"direction must be to_server, to_client or both: {direction!r}")
        super().__init__(proxy, selector, None, seconds)
        self.direction: Direction = direction
        #: Only connections of this client name (CLIENT SETNAME), when given.
        self.client = client
        self.armed_at = time.monotonic()
        #: Connections that sent a selected command (when the selector selects).
        self._conns: set[int] = set()
        #: (connection, direction) pairs already logged as held.
        self._logged: set[tuple[int, str]] = set()

    def _applies(self, conn_id: int, way: _Way) -> bool:
        if self.direction != "both" and self.direction != way:
            return False
        return (self.selector.everything and self.client is None) or conn_id in self._conns


class Stall(_Gate):
    """Hold the bytes of a direction until `release()` or `seconds` after arming."""

    kind = "stall"


class Delay(_Gate):
    """Deliver every frame `seconds` after it reached the proxy (order kept)."""

    kind = "delay"


# --------------------------------------------------------------------------- connections


@dataclass(slots=True)
class _Pending:
    """A forwarded command waiting for its reply."""

    command: Command
    rule: Fault | None
    #: Resolved when the reply is known not to be cut (the client->server pump waits on it).
    resolved: asyncio.Future[None] | None = None


#: Marks, in the pending queue, the point after which replies answer no command.
_BARRIER = object()


@dataclass(slots=True)
class _Item:
    """One frame (or raw run of bytes, or EOF) travelling one direction."""

    data: bytes
    arrived: float
    command: Command | None = None
    reply: ReplyInfo | None = None
    pending: _Pending | None = None
    eof: bool = False
    #: An EOF to turn into a reset of the connection (`on_server_close="reset"`).
    reset: bool = False
    #: Raw client bytes after a parse failure: pairing stops before them.
    unpair: bool = False


def _reset(transport: asyncio.Transport | None) -> None:
    """Close with RST (SO_LINGER 0): the peer gets ECONNRESET, queued bytes are dropped."""
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class _Side(asyncio.Protocol):
    """One socket of a proxied connection (the client's or the server's)."""

    def __init__(self, conn: _Conn, way_in: _Way) -> None:
        self.conn = conn
        #: The direction bytes read from this socket travel.
        self.way_in: _Way = way_in
        self.writable = asyncio.Event()
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        self.conn.received(self.way_in, data)

    def eof_received(self) -> bool:
        self.conn.received_eof(self.way_in)
        return True  # keep the socket half-open: the other direction may still flow

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable.set()
        self.conn.lost(self.way_in)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()


class _ServerSide(_Side):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn.server_made(cast(asyncio.Transport, transport))


class _ClientSide(asyncio.Protocol):
    """The listener's protocol factory product: hands the accepted socket to a new _Conn."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.side: _Side | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.side = self.proxy._accept(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        if self.side is not None:
            self.side.data_received(data)

    def eof_received(self) -> bool:
        return self.side.eof_received() if self.side is not None else False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.side is not None:
            self.side.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.side is not None:
            self.side.pause_writing()

    def resume_writing(self) -> None:
        if self.side is not None:
            self.side.resume_writing()


class _Conn:
    """One client connection and its connection to the server, with one pump task per
    direction. Everything here runs on the proxy's loop."""

    def __init__(self, proxy: FaultProxy, conn_id: int, client: asyncio.Transport) -> None:
        self.proxy = proxy
        self.id = conn_id
        self.loop = asyncio.get_running_loop()
        self.client = client
        peer = client.get_extra_info("peername")
        self.client_port: int = peer[1] if peer else 0
        self.server: asyncio.Transport | None = None
        self.client_side = _Side(self, TO_SERVER)
        self.server_side = _ServerSide(self, TO_CLIENT)
        self.server_ready: asyncio.Future[None] = self.loop.create_future()
        self.queues: dict[_Way, asyncio.Queue[_Item]] = {
            TO_SERVER: asyncio.Queue(),
            TO_CLIENT: asyncio.Queue(),
        }
        self.buffers: dict[_Way, bytearray] = {TO_SERVER: bytearray(), TO_CLIENT: bytearray()}
        self.opaque: dict[_Way, bool] = {TO_SERVER: False, TO_CLIENT: False}
        self.queued: dict[_Way, int] = {TO_SERVER: 0, TO_CLIENT: 0}
        self.read_paused: dict[_Way, bool] = {TO_SERVER: False, TO_CLIENT: False}
        self.eof_sent: dict[_Way, bool] = {TO_SERVER: False, TO_CLIENT: False}
        self.eof_received: dict[_Way, bool] = {TO_SERVER: False, TO_CLIENT: False}
        self.pending: deque[_Pending | object] = deque()
        #: Client side: no command is paired any more (it subscribed, or pairing desynced).
        self.unpaired = False
        #: Server side: replies are paired with `pending`.
        self.pairing = True
        self.commands = 0
        #: (name, script) of every command forwarded so far (guarded by the proxy's lock).
        self.sent: set[tuple[str, str | None]] = set()
        #: The name the client gave this connection (CLIENT SETNAME), if any.
        self.name: str | None = None
        self.dead = False
        self.tasks: list[asyncio.Task[None]] = []

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        for coro in (self._connect(), self._pump_to_server(), self._pump_to_client()):
            self.tasks.append(self.proxy._spawn(coro, self))

    async def _connect(self) -> None:
        proxy = self.proxy
        try:
            await self.loop.create_connection(
                lambda: self.server_side, proxy.target_host, proxy.target_port
            )
        except OSError as exc:
            self.kill(f"server unreachable: {exc}")

    def server_made(self, transport: asyncio.Transport) -> None:
        if self.dead:
            _reset(transport)
            return
        self.server = transport
        if not self.server_ready.done():
            self.server_ready.set_result(None)

    def _source(self, way: _Way) -> asyncio.Transport | None:
        return self.client if way == TO_SERVER else self.server

    def kill(self, reason: str, *, graceful_server: bool = False) -> None:
        """Reset the client socket, reset (or close) the server socket, end the pumps."""
        if self.dead:
            return
        self.dead = True
        _reset(self.client)
        if graceful_server and self.server is not None:
            self.server.close()  # what was forwarded still reaches the server, then FIN
        else:
            _reset(self.server)
        self._end(reason)

    def _finish(self) -> None:
        """Both directions ended cleanly (EOF passed on each way): close both sockets."""
        if self.dead:
            return
        self.dead = True
        self.client.close()
        if self.server is not None:
            self.server.close()
        self._end("closed")

    def _end(self, reason: str) -> None:
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        for entry in self.pending:
            if isinstance(entry, _Pending) and entry.resolved is not None:
                entry.resolved.cancel()
        self.pending.clear()
        self.proxy._forget(self, reason)

    def lost(self, way_in: _Way) -> None:
        """A socket closed: by us (then nothing to do) or by a reset/error from its peer."""
        if not self.dead:
            side = "client" if way_in == TO_SERVER else "server"
            self.kill(f"{side} connection lost")

    # ---------------------------------------------------------------- reading

    def received(self, way: _Way, data: bytes) -> None:
        if self.dead:
            return
        buf = self.buffers[way]
        buf += data
        now = time.monotonic()
        pos = 0
        if not self.opaque[way]:
            pos, error = self._parse(way, buf, now)
            if error is not None:
                self.proxy._note_error(
                    f"conn {self.id}: {way} bytes are not RESP ({error}); forwarded unparsed",
                    fatal=False,
                )
                self.opaque[way] = True
                if way == TO_CLIENT:
                    self._desync()
        if self.opaque[way] and pos < len(buf):
            # From here on commands are not known: replies to them must not be paired.
            self._enqueue(way, _Item(bytes(buf[pos:]), now, unpair=way == TO_SERVER))
            pos = len(buf)
        del buf[:pos]

    def _parse(self, way: _Way, buf: bytearray, now: float) -> tuple[int, ProtocolError | None]:
        """Queue every complete frame of `buf`: the offset of the first byte not consumed, and
        the error that stopped parsing, if any."""
        pos = 0
        try:
            while True:
                if way == TO_SERVER:
                    parsed = parse_command(buf, pos)
                    if parsed is None:
                        return pos, None
                    args, end = parsed
                    command = self.proxy._command(self, args) if args else None
                    self._enqueue(way, _Item(bytes(buf[pos:end]), now, command=command))
                else:
                    found = frame_end(buf, pos)
                    if found is None:
                        return pos, None
                    end = found
                    frame = bytes(buf[pos:end])
                    info = reply_info(frame)
                    self._enqueue(way, _Item(frame, now, reply=info, pending=self._pair(info)))
                pos = end
        except ProtocolError as exc:
            return pos, exc

    def _pair(self, info: ReplyInfo) -> _Pending | None:
        if not self.pairing or info.is_push:
            return None
        if not self.pending:
            self._desync()
            return None
        entry = self.pending.popleft()
        if entry is _BARRIER:
            self.pairing = False
            return None
        pending = cast(_Pending, entry)
        self.proxy._replied(pending.command, info)
        return pending

    def _desync(self) -> None:
        """Stop pairing on this connection: release every rule waiting on a reply."""
        self.pairing = False
        self.unpaired = True
        for entry in self.pending:
            if isinstance(entry, _Pending):
                if entry.rule is not None:
                    self.proxy._untake(entry.rule)
                if entry.resolved is not None and not entry.resolved.done():
                    entry.resolved.set_result(None)
        self.pending.clear()

    def received_eof(self, way: _Way) -> None:
        if self.dead:
            return
        self.eof_received[way] = True
        buf = self.buffers[way]
        if buf:  # an incomplete frame at EOF: pass it on as it is
            self._enqueue(way, _Item(bytes(buf), time.monotonic()))
            buf.clear()
        reset = way == TO_CLIENT and self.proxy.on_server_close == "reset"
        self._enqueue(way, _Item(b"", time.monotonic(), eof=True, reset=reset))
        self.proxy._changes.bump()

    def _enqueue(self, way: _Way, item: _Item) -> None:
        self.queues[way].put_nowait(item)
        self.queued[way] += len(item.data)
        source = self._source(way)
        if self.queued[way] > _HIGH_WATER and not self.read_paused[way] and source is not None:
            self.read_paused[way] = True
            source.pause_reading()

    async def _next(self, way: _Way) -> _Item:
        item = await self.queues[way].get()
        self.queued[way] -= len(item.data)
        source = self._source(way)
        if self.read_paused[way] and self.queued[way] < _LOW_WATER and source is not None:
            self.read_paused[way] = False
            if not source.is_closing():
                source.resume_reading()
        return item

    # ---------------------------------------------------------------- writing

    async def _write(self, way: _Way, data: bytes) -> None:
        transport, side = (
            (self.server, self.server_side) if way == TO_SERVER else (self.client, self.client_side)
        )
        if transport is None or transport.is_closing() or not data:
            return
        transport.write(data)
        await side.writable.wait()

    def _write_eof(self, way: _Way) -> None:
        transport = self.server if way == TO_SERVER else self.client
        if transport is not None and not transport.is_closing() and transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError as exc:  # the peer is gone already
                self.kill(f"write_eof failed: {exc!r}")
                return
        self.eof_sent[way] = True
        if self.eof_sent[TO_SERVER] and self.eof_sent[TO_CLIENT]:
            self._finish()

    async def _pump_to_server(self) -> None:
        await self.server_ready
        proxy = self.proxy
        while True:
            item = await self._next(TO_SERVER)
            command = item.command
            if command is not None:
                proxy._mark(self, command)
            await proxy._gate(self.id, TO_SERVER, item.arrived)
            if item.eof:
                self._write_eof(TO_SERVER)
                return
            if item.unpair and not self.unpaired:
                self.unpaired = True
                self.pending.append(_BARRIER)
            pending: _Pending | None = None
            if command is not None:
                if (rule := proxy._take(CutBefore, command)) is not None:
                    proxy._fire(rule, self.id, command)
                    self.kill(f"cut before {command.name}", graceful_server=True)
                    return
                if self._leaves_request_reply(command):
                    self.unpaired = True
                    self.pending.append(_BARRIER)
                elif not self.unpaired:
                    rule = proxy._take((CutAfter, HoldReply), command)
                    pending = _Pending(command, rule)
                    if isinstance(rule, CutAfter):
                        pending.resolved = self.loop.create_future()
                    self.pending.append(pending)
            await self._write(TO_SERVER, item.data)
            if pending is not None and pending.resolved is not None:
                # Nothing after the command may reach the server before we know whether the
                # connection is cut after it.
                await pending.resolved

    @staticmethod
    def _leaves_request_reply(command: Command) -> bool:
        if command.name in _UNPAIRED_COMMANDS:
            return True
        return (
            command.name == "CLIENT"
            and len(command.args) > 1
            and command.args[1].upper() == b"REPLY"
        )

    async def _pump_to_client(self) -> None:
        proxy = self.proxy
        while True:
            item = await self._next(TO_CLIENT)
            pending = item.pending
            held: HoldReply | None = None
            if pending is not None:
                rule = pending.rule
                command = pending.command
                if rule is not None and _noscript(command, item.reply):
                    proxy._untake(rule)  # the script did not run: the rule waits for the rerun
                    rule = None
                if isinstance(rule, CutAfter):
                    proxy._fire(rule, self.id, command)
                    self.kill(f"cut after {command.name}")
                    return
                if isinstance(rule, HoldReply):
                    held = rule
                    proxy._fire(rule, self.id, command)
                    await proxy._hold(rule)
                if pending.resolved is not None and not pending.resolved.done():
                    pending.resolved.set_result(None)
            await proxy._gate(self.id, TO_CLIENT, item.arrived)
            if item.reset:
                self.kill("server closed the connection")
                return
            if item.eof:
                self._write_eof(TO_CLIENT)
                return
            await self._write(TO_CLIENT, item.data)
            if held is not None:
                with proxy._lock:
                    held._delivered_at.append(time.monotonic())
                held._delivered.bump()


def _noscript(command: Command, reply: ReplyInfo | None) -> bool:
    return (
        command.name in _EVALSHA
        and reply is not None
        and reply.error is not None
        and reply.error.startswith(b"NOSCRIPT")
    )


# --------------------------------------------------------------------------- the proxy


@dataclass
class _Counts:
    commands: Counter[str] = field(default_factory=Counter)
    scripts: Counter[str] = field(default_factory=Counter)
    script_runs: Counter[str] = field(default_factory=Counter)
    noscript: Counter[str] = field(default_factory=Counter)


class FaultProxy:
    """A fault-injecting TCP proxy on 127.0.0.1 in front of `target_host:target_port`.

    Use as a context manager, or `start()` / `stop()`. `port` is known once started.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        port: int = 0,
        password: str | None = None,
        on_server_close: Literal["forward", "reset"] = "forward",
    ) -> None:
        """`port` 0 picks a free port (kept across a `stop()` / `start()` cycle); `password`
        only goes into the URLs `url()` builds. When the server closes a connection (it
        stopped, or killed the client) the proxy passes the EOF on after the bytes before it
        (`"forward"`, what a direct client would see), or resets the client (`"reset"`)."""
        if on_server_close not in ("forward", "reset"):
            raise ValueError(f"on_server_close must be forward or reset: {on_server_close!r}")
        self.target_host = target_host
        self.target_port = target_port
        self.on_server_close = on_server_close
        self.password = password
        self._requested_port = port
        self.port = 0
        self._lock = threading.Lock()
        self._shas = stickless_scripts()
        self._names = frozenset(self._shas.values())
        self._rules: list[Fault] = []
        self._conns: dict[int, _Conn] = {}
        self._next_conn = 0
        self._counts = _Counts()
        self._fired: list[FiredFault] = []
        self._errors: list[str] = []
        self._notes: list[str] = []
        self._refusing = False
        self._refused = 0
        self._changes = _Signal()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        self._stopping: asyncio.Event | None = None
        self._change_event: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> FaultProxy:
        """Listen and serve in a new thread; returns once the port is bound.

        Raises:
            RuntimeError: already running.
            OSError: the port could not be bound.
        """
        if self._thread is not None:
            raise RuntimeError("FaultProxy is already running")
        self._started.clear()
        self._startup_error = None
        thread = threading.Thread(
            target=self._run, name=f"FaultProxy->{self.target_port}", daemon=True
        )
        self._thread = thread
        thread.start()
        if not self._started.wait(WAIT_TIMEOUT):
            raise RuntimeError("FaultProxy did not start")
        if self._startup_error is not None:
            thread.join(WAIT_TIMEOUT)
            self._thread = None
            raise self._startup_error
        return self

    def stop(self) -> None:
        """Reset every connection, close the listener, end the thread and close its loop.
        Idempotent.

        Raises:
            RuntimeError: the thread did not end within the wait bound.
        """
        thread = self._thread
        if thread is None:
            return
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stopping.set)
        thread.join(WAIT_TIMEOUT)
        if thread.is_alive():
            raise RuntimeError("FaultProxy thread did not stop")
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def url(self, db: int = 0) -> str:
        """The `redis://` URL of the proxy (with the password given at construction)."""
        if not self.port:
            raise RuntimeError("FaultProxy is not started")
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        loop.set_exception_handler(self._on_loop_error)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start(), or recorded
            if not self._started.is_set():
                self._startup_error = exc
            else:
                self._note_error(f"proxy loop crashed: {exc!r}")
        finally:
            try:
                leftovers = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in leftovers:
                    task.cancel()
                if leftovers:
                    loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()
                self._loop = None
                self._started.set()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._change_event = asyncio.Event()
        server = await loop.create_server(
            lambda: _ClientSide(self), "127.0.0.1", self._requested_port, reuse_address=True
        )
        self.port = server.sockets[0].getsockname()[1]
        self._requested_port = self.port
        self._started.set()
        try:
            await self._stopping.wait()
        finally:
            server.close()
            for conn in list(self._conns.values()):
                conn.kill("proxy stopped")
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            await server.wait_closed()
            for _ in range(3):  # let the aborted transports run connection_lost
                await asyncio.sleep(0)

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        self._note_error(f"event loop error: {context.get('message')} {context.get('exception')!r}")

    def _note_error(self, message: str, *, fatal: bool = True) -> None:
        with self._lock:
            (self._errors if fatal else self._notes).append(message)
        self._changes.bump()

    def _spawn(self, coro: Coroutine[Any, Any, None], conn: _Conn) -> asyncio.Task[None]:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except OSError as exc:  # the peer went away under us: a network event, no bug
                self._note_error(f"conn {conn.id}: socket error {exc!r}", fatal=False)
                conn.kill(f"socket error {exc!r}")
            except Exception as exc:
                self._note_error(f"conn {conn.id}: pump failed: {exc!r}")
                conn.kill(f"internal error {exc!r}")

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # A task cancelled before its first step never awaits `coro`: close it, quietly.
        task.add_done_callback(lambda _: coro.close())
        return task

    # ---------------------------------------------------------------- thread-crossing helpers

    def _poke(self) -> None:
        """Rules changed (from any thread): make every waiting pump look again."""
        self._changes.bump()
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_change)

    def _on_change(self) -> None:
        old, self._change_event = self._change_event, asyncio.Event()
        if old is not None:
            old.set()

    async def _wait_change(self, seconds: float | None) -> None:
        """Until the rules change, or `seconds` (None: no bound) pass."""
        event = self._change_event
        assert event is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()

    # ---------------------------------------------------------------- connections

    def _accept(self, transport: asyncio.Transport) -> _Side | None:
        with self._lock:
            refusing = self._refusing
            if refusing:
                self._refused += 1
            conn_id = self._next_conn
            self._next_conn += 1
        if refusing:
            _reset(transport)
            self._record(FiredFault("refuse", conn_id, None, None, time.monotonic()))
            return None
        conn = _Conn(self, conn_id, transport)
        with self._lock:
            self._conns[conn_id] = conn
        conn.start()
        self._changes.bump()
        return conn.client_side

    def _forget(self, conn: _Conn, reason: str) -> None:
        with self._lock:
            self._conns.pop(conn.id, None)
        self._changes.bump()

    def _command(self, conn: _Conn, args: list[bytes]) -> Command:
        name = args[0].decode("utf-8", "replace").upper()
        sha: str | None = None
        if name in _EVALSHA and len(args) > 1:
            sha = args[1].decode("ascii", "replace").lower()
        elif name in _EVAL and len(args) > 1:
            sha = hashlib.sha1(args[1]).hexdigest()
        script = self._shas.get(sha) if sha is not None else None
        command = Command(conn.id, conn.commands, tuple(args), name, script, sha)
        conn.commands += 1
        with self._lock:
            self._counts.commands[name] += 1
            if sha is not None:
                self._counts.scripts[script or sha] += 1
        self._changes.bump()
        return command

    def _replied(self, command: Command, reply: ReplyInfo) -> None:
        if command.sha is None:
            return
        key = command.script or command.sha
        with self._lock:
            if _noscript(command, reply):
                self._counts.noscript[key] += 1
            else:
                self._counts.script_runs[key] += 1
        self._changes.bump()

    # ---------------------------------------------------------------- rules

    def _selector(
        self,
        command: str | None,
        script: str | None,
        match: Callable[[Sequence[bytes]], bool] | None,
    ) -> Selector:
        if script is not None and script not in self._names:
            raise ValueError(f"unknown stickless script {script!r}; known: {sorted(self._names)}")
        return Selector(command, script, match)

    def _arm(self, rule: Fault) -> None:
        with self._lock:
            if isinstance(rule, _Gate):
                self._mark_history(rule)
            self._rules.append(rule)
        self._poke()

    def _matches(self, rule: Fault, command: Command) -> bool:
        try:
            return rule.selector.matches(command)
        except Exception as exc:
            self._note_error(f"match predicate of {rule!r} raised {exc!r}")
            return False

    def _take(self, kinds: type[Fault] | tuple[type[Fault], ...], command: Command) -> Fault | None:
        """The first armed rule of `kinds` selecting `command`, with one use taken from it."""
        with self._lock:
            candidates = [r for r in self._rules if isinstance(r, kinds) and r._armed_locked()]
        for rule in candidates:
            if self._matches(rule, command):
                with self._lock:
                    if not rule._armed_locked():
                        continue
                    if rule._remaining is not None:
                        rule._remaining -= 1
                return rule
        return None

    def _untake(self, rule: Fault) -> None:
        with self._lock:
            if rule._remaining is not None:
                rule._remaining += 1

    def _fire(self, rule: Fault, conn_id: int, command: Command | None, detail: str = "") -> None:
        event = FiredFault(
            rule.kind,
            conn_id,
            command.name if command else None,
            command.script if command else None,
            time.monotonic(),
            detail,
        )
        with self._lock:
            rule._events.append(event)
        self._record(event)
        rule._signal.bump()

    def _record(self, event: FiredFault) -> None:
        with self._lock:
            self._fired.append(event)
        self._changes.bump()

    def _mark(self, conn: _Conn, command: Command) -> None:
        """Remember the connections that sent a command a selective stall/delay selects, or
        named themselves as a client-name stall/delay selects."""
        args = command.args
        with self._lock:
            conn.sent.add((command.name, command.script))
            if command.name == "CLIENT" and len(args) > 2 and args[1].upper() == b"SETNAME":
                conn.name = args[2].decode("utf-8", "replace")
            gates = [r for r in self._rules if isinstance(r, _Gate) and not r._cancelled]
        for gate in gates:
            if gate.client is not None:
                if conn.name == gate.client:
                    with self._lock:
                        gate._conns.add(conn.id)
            elif not gate.selector.everything and self._matches(gate, command):
                with self._lock:
                    gate._conns.add(conn.id)

    def _mark_history(self, gate: _Gate) -> None:
        """Select the open connections that already sent the gate's command or script (a
        `match` predicate only sees commands from now on: arguments are not kept)."""
        selector = gate.selector
        if gate.client is not None:
            gate._conns.update(c.id for c in self._conns.values() if c.name == gate.client)
            return
        if selector.everything or selector.match is not None:
            return
        for conn in self._conns.values():
            for name, script in conn.sent:
                if (selector.command is None or name == selector.command.upper()) and (
                    selector.script is None or script == selector.script
                ):
                    gate._conns.add(conn.id)
                    break

    async def _gate(self, conn_id: int, way: _Way, arrived: float) -> None:
        """Wait while a stall or delay holds this connection's `way`."""
        while True:
            now = time.monotonic()
            forever = False
            until: float | None = None
            to_log: list[_Gate] = []
            with self._lock:
                for rule in self._rules:
                    if not isinstance(rule, _Gate) or rule._cancelled:
                        continue
                    if not rule._applies(conn_id, way):
                        continue
                    if isinstance(rule, Stall):
                        end = None if rule.seconds is None else rule.armed_at + rule.seconds
                    else:
                        end = arrived + (rule.seconds or 0.0)
                    if end is not None and end <= now:
                        continue
                    if (conn_id, way) not in rule._logged:
                        rule._logged.add((conn_id, way))
                        to_log.append(rule)
                    if end is None:
                        forever = True
                    else:
                        until = end if until is None else max(until, end)
            for rule in to_log:
                self._fire(rule, conn_id, None, way)
            if not forever and until is None:
                return
            if forever or until is None:
                await self._wait_change(None)
            else:
                await self._wait_change(max(0.0, until - now))

    async def _hold(self, rule: HoldReply) -> None:
        end = None if rule.seconds is None else time.monotonic() + rule.seconds
        while True:
            with self._lock:
                if rule._cancelled:
                    return
            now = time.monotonic()
            if end is not None and now >= end:
                return
            await self._wait_change(None if end is None else end - now)

    # ---------------------------------------------------------------- public faults

    def cut_after(
        self,
        *,
        command: str | None = None,
        script: str | None = None,
        match: Callable[[Sequence[bytes]], bool] | None = None,
        times: int | None = 1,
    ) -> CutAfter:
        """When a selected command is seen, forward it (and nothing after it); when the
        server's reply to it arrives, drop it and reset the connection (both sides)."""
        rule = CutAfter(self, self._selector(command, script, match), times)
        self._arm(rule)
        return rule

    def cut_before(
        self,
        *,
        command: str | None = None,
        script: str | None = None,
        match: Callable[[Sequence[bytes]], bool] | None = None,
        times: int | None = 1,
    ) -> CutBefore:
        """When a selected command is seen, reset the client connection without forwarding
        it (commands before it still reach the server, which then sees the connection
        close)."""
        rule = CutBefore(self, self._selector(command, script, match), times)
        self._arm(rule)
        return rule

    def hold_reply(
        self,
        *,
        seconds: float | None,
        command: str | None = None,
        script: str | None = None,
        match: Callable[[Sequence[bytes]], bool] | None = None,
        times: int | None = 1,
    ) -> HoldReply:
        """Forward a selected command; hold its reply (and everything after it on that
        connection) for `seconds` (None: until `release()`), then deliver in order."""
        rule = HoldReply(self, self._selector(command, script, match), times, seconds)
        self._arm(rule)
        return rule

    def stall(
        self,
        direction: Direction = "both",
        seconds: float | None = None,
        *,
        command: str | None = None,
        script: str | None = None,
        match: Callable[[Sequence[bytes]], bool] | None = None,
        client: str | None = None,
    ) -> Stall:
        """Hold every byte of `direction`, for all connections or (with a selector) those
        that sent a selected command: already (from now on) or later (from that command on),
        until `release()` or `seconds` after now; then deliver in order. With `client`, only
        the connections named so (CLIENT SETNAME), open ones and later ones (from their
        SETNAME on). Fires once per connection and direction held."""
        rule = Stall(self, self._selector(command, script, match), direction, seconds, client)
        self._arm(rule)
        return rule

    def delay(
        self,
        direction: Direction,
        seconds: float,
        *,
        command: str | None = None,
        script: str | None = None,
        match: Callable[[Sequence[bytes]], bool] | None = None,
        client: str | None = None,
    ) -> Delay:
        """Deliver each frame of `direction` `seconds` after it reached the proxy (latency,
        order kept), until `release()`; with `client`, only on the connections named so (as
        `stall`). Fires once per connection and direction delayed."""
        rule = Delay(self, self._selector(command, script, match), direction, seconds, client)
        self._arm(rule)
        return rule

    def reset_all(self) -> int:
        """Reset every open connection now (new ones are accepted); how many were reset."""
        loop = self._loop
        if loop is None:
            return 0

        async def reset() -> int:
            conns = list(self._conns.values())
            for conn in conns:
                self._record(FiredFault("reset_all", conn.id, None, None, time.monotonic()))
                conn.kill("reset_all")
            return len(conns)

        return asyncio.run_coroutine_threadsafe(reset(), loop).result(WAIT_TIMEOUT)

    def reset_connections(self, *, subscribed: bool) -> int:
        """Reset every open connection that subscribed (a pub/sub-only cut: commands go on), or
        every one that did not (a command-only cut: pub/sub goes on); how many were reset."""
        loop = self._loop
        if loop is None:
            return 0

        async def reset() -> int:
            conns = [c for c in self._conns.values() if c.unpaired == subscribed]
            for conn in conns:
                self._record(FiredFault("reset_connections", conn.id, None, None, time.monotonic()))
                conn.kill("reset_connections")
            return len(conns)

        return asyncio.run_coroutine_threadsafe(reset(), loop).result(WAIT_TIMEOUT)

    def refuse_new(self, refuse: bool = True) -> None:
        """While on, every new connection is accepted and reset at once (an unreachable
        server); connections already open are left alone."""
        with self._lock:
            self._refusing = refuse
        self._poke()

    def clear(self) -> None:
        """Disarm every rule (stalls and holds release what they hold)."""
        with self._lock:
            rules, self._rules = self._rules, []
            for rule in rules:
                rule._cancelled = True
        self._poke()

    # ---------------------------------------------------------------- introspection

    @property
    def open_connections(self) -> int:
        """Proxied connections open right now."""
        with self._lock:
            return len(self._conns)

    def connections(self) -> list[ConnectionInfo]:
        with self._lock:
            conns = list(self._conns.values())
        return [
            ConnectionInfo(
                c.id,
                c.client_port,
                c.commands,
                c.unpaired,
                c.name,
                c.eof_received[TO_SERVER],
                c.eof_received[TO_CLIENT],
            )
            for c in conns
        ]

    @property
    def refused(self) -> int:
        """Connections reset by `refuse_new` so far."""
        with self._lock:
            return self._refused

    def command_counts(self) -> Counter[str]:
        """Commands parsed from clients so far, by upper-case name."""
        with self._lock:
            return Counter(self._counts.commands)

    def script_counts(self) -> Counter[str]:
        """EVAL/EVALSHA sent by clients so far, by stickless script name (SHA if unknown)."""
        with self._lock:
            return Counter(self._counts.scripts)

    def script_runs(self) -> Counter[str]:
        """EVAL/EVALSHA the server answered with anything but NOSCRIPT (so: ran), by name;
        replies the proxy then dropped count too."""
        with self._lock:
            return Counter(self._counts.script_runs)

    def noscript_replies(self) -> Counter[str]:
        """EVALSHA the server refused with NOSCRIPT (did not run), by name."""
        with self._lock:
            return Counter(self._counts.noscript)

    def fired(self) -> list[FiredFault]:
        """Every fault that took effect, in order (including resets and refusals)."""
        with self._lock:
            return list(self._fired)

    @property
    def errors(self) -> list[str]:
        """Internal errors (a failed pump, a raising predicate); empty when all is well."""
        with self._lock:
            return list(self._errors)

    @property
    def notes(self) -> list[str]:
        """Non-fatal oddities (a stream that was not RESP and went through unparsed)."""
        with self._lock:
            return list(self._notes)

    async def wait_until(self, predicate: Callable[[], bool], within: float = WAIT_TIMEOUT) -> None:
        """Wait until `predicate()` holds, checking it whenever the proxy's state changes
        (connections, commands, replies, faults), not by polling a clock.

        Raises:
            TimeoutError: it did not hold within `within` seconds.
        """
        deadline = time.monotonic() + within
        while True:
            seen = self._changes.count
            if predicate():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await self._changes.wait_async(seen + 1, remaining):
                if predicate():
                    return
                raise TimeoutError(f"condition not reached within {within}s")

    async def wait_connections(self, count: int, within: float = WAIT_TIMEOUT) -> None:
        """Wait until exactly `count` proxied connections are open."""
        await self.wait_until(lambda: self.open_connections == count, within)
