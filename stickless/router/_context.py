"""What every part of a router shares: its identity, configuration, backends and plumbing."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._config import RouterConfig
from .._metrics import SafeMetrics
from .._trace import Tracing
from ..backends.base import Backends
from ._background import Background
from ._callers import CallerTable
from ._renewal import LeaseRenewer
from ._status import StatusBoard


@dataclass(frozen=True, slots=True)
class NodeContext:
    """One node's shared services, handed to each part of its router."""

    node_id: str
    config: RouterConfig
    backends: Backends
    renewer: LeaseRenewer
    background: Background
    metrics: SafeMetrics
    #: The callers waiting on this node, and the status board: node-wide tables without I/O.
    callers: CallerTable
    board: StatusBoard
    #: Starts the spans of submits, forwards and turns (see stickless/_trace.py).
    tracing: Tracing = field(default_factory=Tracing)


class RouterPart:
    """Base of the router's parts: the node's shared services, unpacked for short access."""

    def __init__(self, ctx: NodeContext) -> None:
        self._node_id = ctx.node_id
        self._config = ctx.config
        self._backends = ctx.backends
        self._renewer = ctx.renewer
        self._bg = ctx.background
        self._metrics = ctx.metrics
        self._tracing = ctx.tracing
        self._callers = ctx.callers
        self._board = ctx.board
