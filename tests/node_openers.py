"""Openers importable by path, for node processes started by tests."""

from __future__ import annotations

from .agents import Journal, ScriptedOpener

OPENER = ScriptedOpener(Journal())
NOT_AN_OPENER = 42


def make_opener() -> ScriptedOpener:
    """A zero-argument factory of an opener (what `stickless node --opener` may name)."""
    return ScriptedOpener(Journal())
