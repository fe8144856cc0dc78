"""Router configuration: timings, bounds and deployment mode."""

from __future__ import annotations

import enum
import re
import uuid
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: A configured node id; 9 characters stay free for the incarnation suffix.
_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,190}")


class DeploymentMode(enum.StrEnum):
    """SINGLE_NODE fills missing backends with memory ones; DISTRIBUTED requires all of them."""

    SINGLE_NODE = "SINGLE_NODE"
    DISTRIBUTED = "DISTRIBUTED"


class RouterConfig(BaseModel):
    """Tunables of one node's router; durations are float seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node_id: str | None = None
    #: Append a per-process incarnation to `node_id` ("web" -> "web/3f9c2a1b"), so routers
    #: started with one configured id (several workers of one app, a restart) never share a
    #: holder identity: each would otherwise take the other's leases as its own. Turn it off
    #: only where every router already gets a unique id (LocalCluster, the Ray layer).
    node_incarnation: bool = True
    mode: DeploymentMode = DeploymentMode.SINGLE_NODE
    idle_ttl: float = Field(default=600.0, gt=0)
    max_cached_sessions: int = Field(default=1000, ge=1)
    lease_ttl: float = Field(default=30.0, gt=0)
    lease_extend_interval: float = Field(default=10.0, gt=0)
    status_heartbeat_interval: float = Field(default=10.0, gt=0)
    holder_loss_sweep_interval: float = Field(default=15.0, gt=0)
    idempotency_primary_ttl: float = Field(default=86400.0, gt=0)
    idempotency_secondary_ttl: float = Field(default=30.0, gt=0)
    forward_ttl: float = Field(default=300.0, gt=0)
    release_interrupt_timeout: float = Field(default=5.0, gt=0)
    watchdog_timeout: float | None = Field(default=None, gt=0)
    max_input_bytes: int = Field(default=1_000_000, ge=1)
    #: How long an interrupted agent may take to return before its turn task is cancelled.
    interrupt_grace: float = Field(default=2.0, gt=0)
    #: Bound of each local subscriber's queue; the oldest frame is dropped past it.
    subscriber_queue_size: int = Field(default=1024, ge=1)
    #: Bound of a turn's remote fan-out queue (rank-based overflow past it).
    relay_queue_size: int = Field(default=4096, ge=1)

    @field_validator("node_id")
    @classmethod
    def _node_id(cls, value: str | None) -> str | None:
        if value is not None and not _NODE_ID.fullmatch(value):
            raise ValueError("must be 1-191 letters, digits or ._:@/+=- starting alphanumeric")
        return value

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.lease_extend_interval >= self.lease_ttl:
            raise ValueError("lease_extend_interval must be shorter than lease_ttl")
        if self.mode is DeploymentMode.DISTRIBUTED and self.node_id is None:
            raise ValueError("node_id is required in DISTRIBUTED mode")
        return self

    @property
    def effective_node_id(self) -> str:
        """The configured node id (callers use `resolved()` to fill a missing one once)."""
        assert self.node_id is not None, "call resolved() first"
        return self.node_id

    @property
    def effective_watchdog_timeout(self) -> float:
        """The watchdog bound: configured, or 3 x lease TTL."""
        return self.watchdog_timeout if self.watchdog_timeout is not None else 3 * self.lease_ttl

    @property
    def forward_poll_interval(self) -> float:
        """How often a waiting forward polls the idempotency store (half the secondary TTL)."""
        return min(self.idempotency_secondary_ttl / 2, self.forward_ttl)

    def resolved(self) -> RouterConfig:
        """This config with its final node id: generated when none was given (SINGLE_NODE
        only), else the configured one with this process's incarnation when asked for."""
        if self.node_id is None:
            return self.model_copy(
                update={"node_id": f"node-{uuid.uuid4().hex[:12]}", "node_incarnation": False}
            )
        if not self.node_incarnation:
            return self
        incarnated = f"{self.node_id}/{uuid.uuid4().hex[:8]}"
        return self.model_copy(update={"node_id": incarnated, "node_incarnation": False})
