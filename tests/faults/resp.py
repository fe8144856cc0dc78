"""Just enough of the Redis protocol (RESP2 and RESP3) to cut a byte stream into frames.

`FaultProxy` forwards bytes unchanged; it only needs to know where each client command and
each server reply ends (so it can pair replies with commands, hold or drop them) and a little
of what they say: a command's arguments, a reply's type and error text. Frames may arrive in
any number of pieces: every function here answers "not complete yet" (None) instead of
guessing, and the caller parses again once more bytes have come.

Recognised types: `+ - : _ # , (` (one line), `$ ! =` (length-prefixed; `$-1` is the RESP2
null bulk), `* ~ >` (aggregates; `*-1` is the RESP2 null array), `%` (map: two frames per
entry) and `|` (attribute: a map that precedes the frame it annotates, treated as part of it).
Streamed RESP3 aggregates (`$?`, `*?`) are never sent by Redis and raise `ProtocolError`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Longest header line accepted before the stream is declared garbage.
MAX_LINE = 64 * 1024
#: Largest bulk string Redis accepts (proto-max-bulk-len default).
MAX_BULK = 512 * 1024 * 1024

_LINE = frozenset(b"+-:_#,(")
_BULK = frozenset(b"$!=")
_AGGREGATE = frozenset(b"*~>")
_MAP = ord("%")
_ATTRIBUTE = ord("|")
_ARRAY = ord("*")
_BULK_STRING = ord("$")
PUSH = ord(">")
ERROR = ord("-")
BLOB_ERROR = ord("!")


class ProtocolError(ValueError):
    """The bytes are not RESP (the caller then stops interpreting the stream)."""


Buffer = bytes | bytearray


def _header(buf: Buffer, pos: int) -> tuple[int, int] | None:
    """The integer of the header line starting at `pos` (after its type byte) and the offset
    just past the line's CRLF; None while the line is incomplete."""
    end = buf.find(b"\r\n", pos + 1)
    if end < 0:
        if len(buf) - pos > MAX_LINE:
            raise ProtocolError("header line too long")
        return None
    try:
        value = int(buf[pos + 1 : end])
    except ValueError:
        raise ProtocolError(f"bad length in header {bytes(buf[pos : end + 2])!r}") from None
    return value, end + 2


def skip(buf: Buffer, pos: int, count: int = 1) -> int | None:
    """The offset just past `count` complete frames starting at `pos`, or None when the
    buffer ends first. Iterative, so nesting depth costs no stack."""
    remaining = count
    size = len(buf)
    while remaining > 0:
        if pos >= size:
            return None
        kind = buf[pos]
        remaining -= 1
        if kind in _LINE:
            end = buf.find(b"\r\n", pos + 1)
            if end < 0:
                if size - pos > MAX_LINE:
                    raise ProtocolError("line too long")
                return None
            pos = end + 2
            continue
        header = _header(buf, pos)
        if header is None:
            return None
        length, body = header
        if kind in _BULK:
            if length < 0:
                if length != -1 or kind != _BULK_STRING:
                    raise ProtocolError(f"bad bulk length {length}")
                pos = body
                continue
            if length > MAX_BULK:
                raise ProtocolError(f"bulk of {length} bytes")
            end = body + length + 2
            if end > size:
                return None
            if buf[end - 2 : end] != b"\r\n":
                raise ProtocolError("bulk not terminated by CRLF")
            pos = end
        elif kind in _AGGREGATE:
            if length < -1 or (length == -1 and kind != _ARRAY):
                raise ProtocolError(f"bad aggregate length {length}")
            remaining += max(length, 0)
            pos = body
        elif kind == _MAP:
            if length < 0:
                raise ProtocolError(f"bad map length {length}")
            remaining += 2 * length
            pos = body
        elif kind == _ATTRIBUTE:
            if length < 0:
                raise ProtocolError(f"bad attribute length {length}")
            # The attribute's entries, then the frame it annotates (which takes its place).
            remaining += 2 * length + 1
            pos = body
        else:
            raise ProtocolError(f"unknown type byte {bytes([kind])!r}")
    return pos


def frame_end(buf: Buffer, pos: int = 0) -> int | None:
    """The offset just past the one frame starting at `pos`, or None while incomplete."""
    return skip(buf, pos, 1)


@dataclass(frozen=True, slots=True)
class ReplyInfo:
    """What the proxy needs to know of one server frame."""

    #: Type byte of the frame itself (after any attribute), e.g. ord("+"), ord(">").
    kind: int
    #: The error text of `-` and `!` frames, else None.
    error: bytes | None

    @property
    def is_push(self) -> bool:
        """A RESP3 push (pub/sub message, invalidation): never the reply to a command."""
        return self.kind == PUSH

    @property
    def is_error(self) -> bool:
        return self.error is not None


def reply_info(frame: Buffer) -> ReplyInfo:
    """Describe one complete server frame (as cut by `frame_end`)."""
    pos = 0
    while frame[pos] == _ATTRIBUTE:
        header = _header(frame, pos)
        if header is None:
            raise ProtocolError("incomplete attribute")
        length, body = header
        after = skip(frame, body, 2 * length)
        if after is None:
            raise ProtocolError("incomplete attribute")
        pos = after
    kind = frame[pos]
    error: bytes | None = None
    if kind == ERROR:
        error = bytes(frame[pos + 1 : frame.find(b"\r\n", pos)])
    elif kind == BLOB_ERROR:
        header = _header(frame, pos)
        if header is None:
            raise ProtocolError("incomplete blob error")
        length, body = header
        error = bytes(frame[body : body + length])
    return ReplyInfo(kind, error)


def parse_command(buf: Buffer, pos: int = 0) -> tuple[list[bytes], int] | None:
    """One client command starting at `pos`: its arguments and the offset just past it, or
    None while incomplete. A command is an array of bulk strings, or (inline form) one line of
    space-separated words; an empty inline line yields no arguments."""
    if pos >= len(buf):
        return None
    if buf[pos] != _ARRAY:
        end = buf.find(b"\n", pos)
        if end < 0:
            if len(buf) - pos > MAX_LINE:
                raise ProtocolError("inline command too long")
            return None
        return [bytes(word) for word in bytes(buf[pos:end]).split()], end + 1
    header = _header(buf, pos)
    if header is None:
        return None
    count, cursor = header
    if count < 0:
        # `*-1` / `*0`: nothing to run; Redis ignores it too.
        return [], cursor
    args: list[bytes] = []
    for _ in range(count):
        if cursor >= len(buf):
            return None
        if buf[cursor] != _BULK_STRING:
            raise ProtocolError("command argument is not a bulk string")
        header = _header(buf, cursor)
        if header is None:
            return None
        length, body = header
        if length < 0 or length > MAX_BULK:
            raise ProtocolError(f"bad argument length {length}")
        end = body + length + 2
        if end > len(buf):
            return None
        if buf[end - 2 : end] != b"\r\n":
            raise ProtocolError("argument not terminated by CRLF")
        args.append(bytes(buf[body : end - 2]))
        cursor = end
    return args, cursor


def encode_command(*args: bytes | str | int) -> bytes:
    """`args` as one RESP array of bulk strings (what a client sends)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)
