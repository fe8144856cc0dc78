"""The opener of the demo agent: what `cluster.yaml` deploys by default and `stickless demo
--ray N` deploys (`stickless.demo.opener:make_opener`), importable on every node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._session import LiveSession
from .agent import AgentLedger, ScriptedAgent

#: Import path of `make_opener`, as `stickless ray-deploy --opener` takes it.
OPENER_PATH = "stickless.demo.opener:make_opener"


class DemoOpener:
    """Opens a `ScriptedAgent` per session (recording each opening in the ledger, if any)."""

    def __init__(self, ledger: AgentLedger | None = None, token_delay: float = 0.02) -> None:
        self._ledger = ledger
        self._delay = token_delay

    async def open(
        self, session_id: str, agent_ref: str, attributes: Mapping[str, Any]
    ) -> LiveSession:
        if self._ledger is not None:
            self._ledger.opened[session_id] += 1
        return ScriptedAgent(session_id, self._ledger, self._delay)


def make_opener() -> DemoOpener:
    """The opener routers deploy by import path (`OPENER_PATH`)."""
    return DemoOpener()
