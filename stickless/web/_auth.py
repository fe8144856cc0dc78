"""Who is calling (authentication) and what they may do to a session (authorization)."""

from __future__ import annotations

import enum
import hmac
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from fastapi import Request

from .._types import Principal

#: The principal of every request when the gateway runs without an authenticator.
ANONYMOUS = Principal(id="anonymous")


class Unauthenticated(Exception):
    """The request carries no valid credentials (HTTP 401)."""


class Action(enum.StrEnum):
    """What a request does to a session, as the authorizer is asked about it."""

    SUBMIT = "submit"
    READ = "read"
    INTERRUPT = "interrupt"
    RELEASE = "release"
    DELETE = "delete"


class Authenticator(Protocol):
    """Maps a request to its principal.

    Raises:
        Unauthenticated: the request's credentials are missing or wrong.
    """

    async def authenticate(self, request: Request) -> Principal: ...


class Authorizer(Protocol):
    """Decides whether a principal may act on a session, given the session's owner stamp (the
    principal that created it; None when nobody did through the gateway). A refusal is
    answered 404, the same as a session that does not exist."""

    def allows(self, principal: Principal, owner: str | None, action: Action) -> bool: ...


class OwnerOnly:
    """The default: only the principal that created a session may see or touch it."""

    def allows(self, principal: Principal, owner: str | None, action: Action) -> bool:
        return owner == principal.id


class BearerTokens:
    """`Authorization: Bearer <token>` against a fixed table {token: principal id}."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        """Raises: ValueError: a token or principal id is empty or not a string."""
        for token, principal in tokens.items():
            if not isinstance(token, str) or not token:
                raise ValueError("tokens: every token must be a non-empty string")
            if not isinstance(principal, str) or not principal:
                raise ValueError(f"tokens: the principal of a token must be a non-empty string, "
                                 f"got {principal!r}")
        self._tokens = dict(tokens)

    @classmethod
    def from_file(cls, path: str | Path) -> BearerTokens:
        """Load the table from a JSON file `{"<token>": "<principal id>", ...}`.

        Raises:
            ValueError: the file is not such a JSON object.
            OSError: the file cannot be read.
        """
        try:
            table = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"tokens file {path}: not JSON ({exc})") from None
        if not isinstance(table, dict):
            raise ValueError(f"tokens file {path}: must be a JSON object {{token: principal id}}")
        return cls(table)

    async def authenticate(self, request: Request) -> Principal:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("missing bearer token (Authorization: Bearer <token>)")
        token = token.strip()
        for known, principal in self._tokens.items():
            # Compare every token in constant time, so timing tells nothing about any of them.
            if hmac.compare_digest(known.encode(), token.encode()):
                return Principal(id=principal)
        raise Unauthenticated("unknown bearer token")
