"""Contract: the session owner stamp (who created a session), on every backend."""

from __future__ import annotations

from stickless.backends.base import Backends


async def test_the_first_claim_stamps_and_later_claims_read_the_stamp(backends: Backends) -> None:
    assert await backends.owners.owner("s1") is None
    assert await backends.owners.claim("s1", "alice") == "alice"
    assert await backends.owners.claim("s1", "alice") == "alice"  # repeated: same effect
    assert await backends.owners.claim("s1", "bob") == "alice"
    assert await backends.owners.owner("s1") == "alice"
    assert await backends.owners.owner("s2") is None


async def test_forget_frees_the_session_for_a_new_owner(backends: Backends) -> None:
    await backends.owners.claim("s1", "alice")
    await backends.owners.forget("s1")
    await backends.owners.forget("s1")  # repeated: no error
    assert await backends.owners.owner("s1") is None
    assert await backends.owners.claim("s1", "bob") == "bob"
