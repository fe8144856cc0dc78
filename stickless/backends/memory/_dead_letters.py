"""The in-memory dead-letter store: packed letters per session, as the Redis store keeps them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ...wire import WireError
from ..base import (
    DeadLetter,
    check_letter,
    letter_session,
    pack_letter,
    unpack_letter,
    unreadable_letter,
)
from ._shared import Link, State


def _decode(session_id: str, letter_id: str, data: bytes) -> DeadLetter:
    """A stored letter, or what a listing reports for bytes that are not one."""
    try:
        return unpack_letter(data)
    except WireError as exc:
        return unreadable_letter(letter_id, session_id, data, str(exc))


def keep_letter(state: State, letter: DeadLetter, now: float) -> bool:
    """Keep a letter unless one with its id is kept (the lock held); True when added."""
    letters = state.dead_letters.setdefault(check_letter(letter), {})
    if letter.letter_id in letters:
        return False
    if letter.dead_at == 0:
        letter = replace(letter, dead_at=now)
    letters[letter.letter_id] = pack_letter(letter)
    return True


class MemoryDeadLetterStore:
    """Letters kept packed (so a corrupt one behaves as in Redis), filed by session."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def add(self, letter: DeadLetter) -> bool:
        """Keep the letter once, stamping `dead_at` with the store clock when it is 0."""
        check_letter(letter)
        with self._link.open() as state:
            return keep_letter(state, letter, state.clock())

    async def plant_raw(self, session_id: str, letter_id: str, data: bytes) -> None:
        """Test hook: store arbitrary bytes as a letter (to plant corrupt ones)."""
        with self._link.open() as state:
            state.dead_letters.setdefault(session_id, {})[letter_id] = data

    async def list(
        self, limit: int, session_id: str | None = None, before: float | None = None
    ) -> list[DeadLetter]:
        """Up to `limit` letters, newest first, strictly older than `before` when given."""
        with self._link.open() as state:
            sessions = list(state.dead_letters) if session_id is None else [session_id]
            stored = [
                (sid, letter_id, data)
                for sid in sessions
                for letter_id, data in state.dead_letters.get(sid, {}).items()
            ]
        letters = [_decode(sid, letter_id, data) for sid, letter_id, data in stored]
        if before is not None:
            letters = [letter for letter in letters if letter.dead_at < before]
        letters.sort(key=lambda letter: (letter.dead_at, letter.letter_id), reverse=True)
        return letters[: max(limit, 0)]

    async def get(self, letter_id: str) -> DeadLetter | None:
        """The letter, or None."""
        session_id = letter_session(letter_id)
        if session_id is None:
            return None
        with self._link.open() as state:
            data = state.dead_letters.get(session_id, {}).get(letter_id)
        return None if data is None else _decode(session_id, letter_id, data)

    async def remove(self, letter_ids: Sequence[str]) -> int:
        """Drop these letters; how many were kept."""
        removed = 0
        with self._link.open() as state:
            for letter_id in dict.fromkeys(letter_ids):
                session_id = letter_session(letter_id)
                letters = None if session_id is None else state.dead_letters.get(session_id)
                if session_id is None or letters is None or letters.pop(letter_id, None) is None:
                    continue
                removed += 1
                if not letters:
                    del state.dead_letters[session_id]
        return removed

    async def purge(self, session_id: str | None = None) -> int:
        """Drop every letter of the session, or of every session."""
        with self._link.open() as state:
            if session_id is None:
                removed = sum(len(letters) for letters in state.dead_letters.values())
                state.dead_letters.clear()
                return removed
            return len(state.dead_letters.pop(session_id, {}))

    async def count(self, session_id: str | None = None) -> int:
        """How many letters the session (or every session) has."""
        with self._link.open() as state:
            if session_id is None:
                return sum(len(letters) for letters in state.dead_letters.values())
            return len(state.dead_letters.get(session_id, {}))
