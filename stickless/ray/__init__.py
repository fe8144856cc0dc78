"""Ray deployment: one NodeRouter actor per Ray node, and handles for application code.

Requires the `ray` extra (`pip install 'stickless[ray]'`) and the `redis` extra: routers on
different Ray nodes share state through Redis.
"""

try:
    import ray as _ray  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("stickless.ray needs Ray: pip install 'stickless[ray]'") from exc

from ._actor import ROUTER_PREFIX, NodeRouter, RouterTicket
from ._deploy import any_router, deploy, local_router, router_name, routers, undeploy

__all__ = [
    "ROUTER_PREFIX",
    "NodeRouter",
    "RouterTicket",
    "any_router",
    "deploy",
    "local_router",
    "router_name",
    "routers",
    "undeploy",
]
