"""Fault injection between a node and Redis: `FaultProxy`, a loopback TCP proxy that parses the
Redis protocol and cuts, holds, stalls or resets connections at exact commands."""

from .proxy import (
    Command,
    ConnectionInfo,
    CutAfter,
    CutBefore,
    Delay,
    Direction,
    Fault,
    FaultProxy,
    FiredFault,
    HoldReply,
    Selector,
    Stall,
    stickless_scripts,
)

__all__ = [
    "Command",
    "ConnectionInfo",
    "CutAfter",
    "CutBefore",
    "Delay",
    "Direction",
    "Fault",
    "FaultProxy",
    "FiredFault",
    "HoldReply",
    "Selector",
    "Stall",
    "stickless_scripts",
]
