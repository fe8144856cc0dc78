"""Authentication (bearer tokens), per-session visibility and per-principal idempotency."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stickless import Principal
from stickless.web import Action, BearerTokens

from .conftest import ALICE, BOB, Served, turn


class Everyone:
    """An authorizer letting every principal act on every session."""

    def allows(self, principal: Principal, owner: str | None, action: Action) -> bool:
        return True


async def test_a_request_without_or_with_a_wrong_token_is_401(make_app: Any) -> None:
    served: Served = await make_app(auth=True)
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"}):
        answer = await served.client.post("/v1/sessions/s1/turns", json=turn("x"),
                                          headers=headers)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "UNAUTHENTICATED"
        assert answer.headers["www-authenticate"] == "Bearer"
    assert await served.router.transcript("s1") == []
    # Probes need no token.
    assert (await served.client.get("/healthz")).status_code == 200


async def test_a_session_is_invisible_to_every_other_principal(make_app: Any) -> None:
    served: Served = await make_app(auth=True)
    client = served.client
    created = await client.post("/v1/sessions/s1/turns", json=turn("mine"), headers=ALICE)
    assert created.status_code == 202
    turn_url = created.headers["location"]
    assert (await client.get(turn_url, params={"wait": 10}, headers=ALICE)).status_code == 200
    refused = [
        await client.get(turn_url, headers=BOB),
        await client.get(f"{turn_url}/events", headers=BOB),
        await client.get("/v1/sessions/s1/events", headers=BOB),
        await client.post("/v1/sessions/s1/turns", json=turn("hijack"), headers=BOB),
        await client.post("/v1/sessions/s1/interrupt", headers=BOB),
        await client.post("/v1/sessions/s1/release", headers=BOB),
        await client.delete("/v1/sessions/s1", headers=BOB),
        await client.get("/v1/sessions/s1", headers=BOB),
        await client.get("/v1/sessions/s1/transcript", headers=BOB),
    ]
    for answer in refused:
        assert answer.status_code == 404, answer.request.url
        assert answer.json()["error"]["code"] == "UNKNOWN_SESSION"
    # An unknown session reads the same to bob (no way to tell it exists).
    unknown = await client.get("/v1/sessions/nobody/transcript", headers=BOB)
    assert unknown.json() == refused[-1].json() | {
        "error": {"code": "UNKNOWN_SESSION", "message": "no session 'nobody'"}
    }
    # Nothing of bob's ran, and alice still sees and controls her session.
    entries = (await client.get("/v1/sessions/s1/transcript", headers=ALICE)).json()["entries"]
    assert [e["content"] for e in entries if e["role"] == "user"] == ["mine"]
    assert (await client.delete("/v1/sessions/s1", headers=ALICE)).status_code == 204
    # A deleted session is free to be created again, by anyone.
    again = await client.post("/v1/sessions/s1/turns", json=turn("bob's now"), headers=BOB)
    assert again.status_code == 202


async def test_idempotency_keys_are_scoped_per_principal(make_app: Any) -> None:
    served: Served = await make_app(auth=True, authorizer=Everyone())
    client = served.client
    key = {"Idempotency-Key": "shared-key"}
    by_alice = await client.post("/v1/sessions/s1/turns", json=turn("hi"), headers=ALICE | key)
    await client.get(by_alice.headers["location"], params={"wait": 10}, headers=ALICE)
    by_bob = await client.post("/v1/sessions/s1/turns", json=turn("hi"), headers=BOB | key)
    assert by_bob.json()["origin"] == "new"
    assert by_bob.json()["turn_id"] != by_alice.json()["turn_id"]
    again = await client.post("/v1/sessions/s1/turns", json=turn("hi"), headers=ALICE | key)
    assert again.json()["turn_id"] == by_alice.json()["turn_id"]


async def test_the_initiator_of_a_turn_is_its_principal(make_app: Any) -> None:
    served: Served = await make_app(auth=True)
    seen: list[Principal | None] = []
    original = served.router.submit

    async def spy(request: Any) -> Any:
        seen.append(request.initiator)
        return await original(request)

    served.router.submit = spy  # type: ignore[method-assign]
    await served.client.post("/v1/sessions/s1/turns", json=turn("x"), headers=ALICE)
    assert seen == [Principal(id="alice")]


def test_a_tokens_file_must_be_a_json_object_of_strings(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    for text, rule in [("[1]", "JSON object"), ("{", "not JSON"), ('{"t": 3}', "principal")]:
        path.write_text(text)
        with pytest.raises(ValueError, match=rule):
            BearerTokens.from_file(path)
