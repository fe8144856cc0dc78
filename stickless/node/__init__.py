"""Run a router as its own process and talk to it over loopback (tests, benchmarks, tools)."""

from ._client import NodeClient, RemoteEventStream
from ._server import NodeServer
from ._service import NodeService, error_from_wire, error_to_wire, load_opener

__all__ = [
    "NodeClient",
    "NodeServer",
    "NodeService",
    "RemoteEventStream",
    "error_from_wire",
    "error_to_wire",
    "load_opener",
]
