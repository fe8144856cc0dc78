"""The agent Ray router actors open in tests (importable by path on every node)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from stickless import LiveSession, TextDelta, TranscriptEntry, TurnContext, TurnOutput


class EchoSession:
    """Echoes the input; `gate:forever` never returns on its own (until interrupted)."""

    async def run_turn(self, turn: TurnContext) -> TurnOutput:
        text = turn.input.as_text()
        turn.emit(TextDelta(text=text))
        if text == "gate:forever":
            await turn.interrupted.wait()
        await turn.transcript.append(TranscriptEntry(role="user", content=text))
        await asyncio.sleep(0)
        return TurnOutput(text=f"echo:{text}")

    async def interrupt(self, reason: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


class EchoOpener:
    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        return EchoSession()


def make_opener() -> EchoOpener:
    return EchoOpener()
