"""The HTTP/SSE gateway (extra `web`): `create_app(router)` or `api_router` in your own app."""

from ._ai_sdk import AISdkSettings, ai_sdk_router
from ._app import create_app, probes_router
from ._auth import (
    ANONYMOUS,
    Action,
    Authenticator,
    Authorizer,
    BearerTokens,
    OwnerOnly,
    Unauthenticated,
)
from ._routes import Gateway, GatewaySettings, api_router, scoped_key

__all__ = [
    "ANONYMOUS",
    "AISdkSettings",
    "Action",
    "Authenticator",
    "Authorizer",
    "BearerTokens",
    "Gateway",
    "GatewaySettings",
    "OwnerOnly",
    "Unauthenticated",
    "ai_sdk_router",
    "api_router",
    "create_app",
    "probes_router",
    "scoped_key",
]
