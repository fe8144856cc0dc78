"""Idempotency keys: a client's own key, or an internal per-turn key, and how long each lives."""

from __future__ import annotations

from .._config import RouterConfig
from .._types import SubmitRequest
from ..wire import CLIENT_KEY_PREFIX

#: Prefixes keep client idempotency keys and per-turn internal keys apart.
_TURN_KEY = "t:"


def reservation_key(req: SubmitRequest, turn_id: str) -> str:
    """The key a submit reserves: the client's idempotency key, else one private to the turn."""
    if req.idempotency_key is not None:
        return CLIENT_KEY_PREFIX + req.idempotency_key
    return _TURN_KEY + turn_id


def primary_ttl(config: RouterConfig, key: str) -> float:
    """How long a finished reservation keeps its answer."""
    # Internal per-turn keys only need to outlive the pollers that may read them.
    if key.startswith(_TURN_KEY):
        return min(config.idempotency_primary_ttl, config.forward_ttl * 2)
    return config.idempotency_primary_ttl


def queued_staleness(config: RouterConfig) -> float:
    """How long a queued (holderless) reservation waits before the holder-loss sweep may reset
    it: past `forward_ttl`, so the submitter's own deadline decides first."""
    return config.forward_ttl + config.idempotency_secondary_ttl


def in_flight_ttl(config: RouterConfig) -> float:
    """How long a reservation may stay in flight (queued or running) before it expires: as long
    as any key keeps its answer, so a long turn never finds its reservation gone (recording the
    outcome then sets the key's own `primary_ttl`)."""
    return config.idempotency_primary_ttl
