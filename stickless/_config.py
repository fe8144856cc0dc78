"""Router configuration: timings, bounds and deployment mode."""

from __future__ import annotations

import enum
import re
import uuid
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ._retry import RetryPolicy

#: A configured node id; 9 characters stay free for the incarnation suffix.
_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,190}")
#: Largest `max_input_bytes`: an envelope (input, request maps of at most 64 KiB each, ids)
#: must stay below the wire's frame bound (`wire.MAX_FRAME_BYTES`, 32 MiB) to be decodable.
MAX_INPUT_BYTES_BOUND = 16 * 1024 * 1024
#: Bounds of `max_relay_batch_bytes`.
MIN_RELAY_BATCH_BYTES = 256 * 1024
MAX_RELAY_BATCH_BYTES = 8 * 1024 * 1024


class DeploymentMode(enum.StrEnum):
    """SINGLE_NODE fills missing backends with memory ones; DISTRIBUTED requires all of them."""

    SINGLE_NODE = "SINGLE_NODE"
    DISTRIBUTED = "DISTRIBUTED"


class RouterConfig(BaseModel):
    """Tunables of one node's router; durations are float seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: 1-200 of letters, digits and ._:@/+=-, starting alphanumeric (the whole string: no
    #: trailing newline).
    node_id: str | None = None
    #: Append a per-process incarnation to `node_id` ("web" -> "web/3f9c2a1b"), so routers
    #: started with one configured id (several workers of one app, a restart) never share a
    #: holder identity: each would otherwise take the other's leases as its own. Turn it off
    #: only where every router already gets a unique id (LocalCluster, the Ray layer).
    node_incarnation: bool = True
    mode: DeploymentMode = DeploymentMode.SINGLE_NODE
    idle_ttl: float = Field(default=600.0, gt=0)
    max_cached_sessions: int = Field(default=1000, ge=1)
    #: The node's liveness TTL: its leases and the reservations it holds are valid while its
    #: incarnation's liveness key lives, which expires this long after the last renewal (see
    #: "Node liveness" in docs/architecture.md). With the defaults (3 s, renewed every 1 s,
    #: swept every 1 s) a holder that dies is known dead, and its waiting callers answered
    #: HOLDER_LOST, within about 4 s.
    lease_ttl: float = Field(default=3.0, gt=0)
    #: Renewal period of the node's liveness (one store call, however many sessions it holds).
    #: Must be shorter than `lease_ttl` (else the liveness expires between two renewals).
    lease_extend_interval: float = Field(default=1.0, gt=0)
    status_heartbeat_interval: float = Field(default=10.0, gt=0)
    #: Period of the sweep for dead holders and stale reservations.
    holder_loss_sweep_interval: float = Field(default=1.0, gt=0)
    idempotency_primary_ttl: float = Field(default=86400.0, gt=0)
    #: A holderless IN_FLIGHT reservation (its message queued for the next holder) unclaimed for
    #: this long is stale; a held one is stale as soon as its holder's liveness ends. Must be
    #: longer than `lease_extend_interval`.
    idempotency_secondary_ttl: float = Field(default=30.0, gt=0)
    forward_ttl: float = Field(default=300.0, gt=0)
    release_interrupt_timeout: float = Field(default=5.0, gt=0)
    #: Renewals stop when the main loop has not beaten for this long (None: 3 x `lease_ttl`).
    #: Must be longer than the main loop's beat period, `heartbeat_interval` (half the extend
    #: interval, at most 1 s): at or below it a healthy, idle node trips its own watchdog
    #: between two beats and drops its leases.
    watchdog_timeout: float | None = Field(default=None, gt=0)
    #: Largest accepted encoded input; at most 16 MiB (MAX_INPUT_BYTES_BOUND), so that every
    #: accepted request can also be forwarded (an envelope must fit the wire's 32 MiB frame).
    max_input_bytes: int = Field(default=1_000_000, ge=1, le=MAX_INPUT_BYTES_BOUND)
    #: How long an interrupted agent may take to return before its turn task is cancelled.
    interrupt_grace: float = Field(default=2.0, gt=0)
    #: Commit what a turn the user interrupted had staged (entries marked `partial`), so the
    #: next turn's history holds the text the user already saw; off: it commits nothing.
    commit_partial_on_interrupt: bool = False
    #: Bound of each local subscriber's queue; the oldest frame is dropped past it.
    subscriber_queue_size: int = Field(default=1024, ge=1)
    #: Bound of a turn's remote fan-out queue (rank-based overflow past it).
    relay_queue_size: int = Field(default=4096, ge=1)
    #: Largest relay batch, in bytes: one EVENT signal (one PUBLISH, one event-log script)
    #: carries at most this much; a turn's frames go out in as many batches as that takes, and
    #: every frame must fit one batch alone (see "Bounded messages" in docs/architecture.md).
    #: At least 256 KiB (room for the longest runtime frame) and at most 8 MiB, well under
    #: Redis's default pub/sub output-buffer limit (32 MiB) and the wire's frame bound.
    max_relay_batch_bytes: int = Field(
        default=1024 * 1024, ge=MIN_RELAY_BATCH_BYTES, le=MAX_RELAY_BATCH_BYTES
    )
    #: What happens to the turn that was running when its holder was lost: "fail" answers
    #: HOLDER_LOST; "retry" runs it again on the session's next holder, as the next attempt,
    #: up to `holder_lost_max_attempts` runs in all (every turn then keeps a durable copy of its
    #: message while it runs, one more store write per turn submitted on its holder).
    on_holder_lost: Literal["fail", "retry"] = "fail"
    holder_lost_max_attempts: int = Field(default=3, ge=1, le=100)
    #: Run a turn whose agent raised again, durably scheduled (None: never).
    retry: RetryPolicy | None = None

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
        if self.idempotency_secondary_ttl <= self.lease_extend_interval:
            raise ValueError(
                f"idempotency_secondary_ttl ({self.idempotency_secondary_ttl}s) must be longer "
                f"than lease_extend_interval ({self.lease_extend_interval}s)"
            )
        if self.watchdog_timeout is not None and self.watchdog_timeout <= self.heartbeat_interval:
            raise ValueError(
                f"watchdog_timeout ({self.watchdog_timeout}s) must be longer than the main "
                f"loop's heartbeat period ({self.heartbeat_interval}s: half of "
                "lease_extend_interval, at most 1s), or a healthy node stops renewing its leases"
            )
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
    def command_path_timeout(self) -> float:
        """How long the store calls a node sends over its own connections may go unanswered
        (while its loop runs) before it stops vouching for its sessions: one lease TTL (see
        "Node liveness" in docs/architecture.md)."""
        return self.lease_ttl

    @property
    def heartbeat_interval(self) -> float:
        """How often the main loop tells the renewal watchdog it is alive."""
        return min(self.lease_extend_interval / 2, 1.0)

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
