"""RecordStore contract: agent binding, fence, and fenced transcript commits."""

from __future__ import annotations

import pytest

from stickless._types import CommittedEntry, TranscriptEntry
from stickless.backends.base import Backends, FencedOut, RecordView, StagedCommit
from stickless.wire import Outcome

from ..commits import commit_turn


def _entry(content: str, role: str = "user") -> TranscriptEntry:
    return TranscriptEntry(role=role, content=content, data={"n": len(content), "ok": True})


async def test_load_missing_record_is_none(backends: Backends) -> None:
    # Given a session that was never provisioned
    # When it is loaded
    view = await backends.records.load("nobody")
    # Then there is no record
    assert view is None


async def test_provision_creates_record_bound_to_agent(backends: Backends) -> None:
    # Given no record for the session
    # When it is provisioned for agent-a under token 3
    bound = await backends.records.provision("s1", "agent-a", 3)
    # Then it is bound to agent-a with fence 3 and an empty transcript
    assert bound == "agent-a"
    assert await backends.records.load("s1") == RecordView("s1", "agent-a", 3)


async def test_provision_with_other_agent_returns_existing_binding(backends: Backends) -> None:
    # Given the session is bound to agent-a
    await backends.records.provision("s1", "agent-a", 1)
    # When it is provisioned for agent-b
    bound = await backends.records.provision("s1", "agent-b", 1)
    # Then the existing binding is returned and kept
    assert bound == "agent-a"
    view = await backends.records.load("s1")
    assert view is not None
    assert view.agent_ref == "agent-a"


async def test_provision_without_an_agent_leaves_the_session_unbound_until_one_binds(
    backends: Backends,
) -> None:
    records = backends.records
    # Given a session provisioned under token 3 with no agent (a holder before its opener
    # accepted one)
    assert await records.provision("s1", None, 3) is None
    # Then it has a record with the fence and no binding
    assert await records.load("s1") == RecordView("s1", None, 3)
    assert await records.binding("s1") is None
    # And a later provision without an agent leaves it unbound, raising the fence
    assert await records.provision("s1", None, 4) is None
    # When agent-a binds it, then agent-b tries to
    assert await records.provision("s1", "agent-a", 4) == "agent-a"
    assert await records.provision("s1", "agent-b", 4) == "agent-a"
    # Then the first binding stays, and a provision without an agent answers it
    assert await records.provision("s1", None, 4) == "agent-a"
    assert await records.load("s1") == RecordView("s1", "agent-a", 4)


async def test_a_fenced_out_bind_binds_nothing(backends: Backends) -> None:
    records = backends.records
    # Given an unbound session whose fence is 5
    await records.provision("s1", None, 5)
    # When a holder of an older lease binds its agent
    with pytest.raises(FencedOut):
        await records.provision("s1", "agent-a", 4)
    # Then the session is still unbound, and the holder of the current lease binds its own
    assert await records.binding("s1") is None
    assert await records.provision("s1", "agent-b", 5) == "agent-b"


async def test_a_bind_creates_a_missing_record(backends: Backends) -> None:
    # Given no record (deleted meanwhile, say), an accepted agent binds under its token
    assert await backends.records.provision("s1", "agent-a", 2) == "agent-a"
    assert await backends.records.load("s1") == RecordView("s1", "agent-a", 2)


async def test_provision_raises_fence_and_refuses_older_token(backends: Backends) -> None:
    # Given the session was provisioned under token 2
    await backends.records.provision("s1", "agent-a", 2)
    # When it is provisioned under 5, again under 5, then under 4
    await backends.records.provision("s1", "agent-a", 5)
    await backends.records.provision("s1", "agent-a", 5)
    # Then the fence is 5 and the older token is fenced out without lowering it
    with pytest.raises(FencedOut):
        await backends.records.provision("s1", "agent-a", 4)
    view = await backends.records.load("s1")
    assert view is not None
    assert view.fence == 5


async def test_commit_appends_entries_tagged_with_turn_and_token(backends: Backends) -> None:
    # Given a provisioned session
    await backends.records.provision("s1", "agent-a", 1)
    # When two turns commit in order
    await commit_turn(backends, "s1", 1, "t1", [_entry("hi"), _entry("hello", "assistant")])
    await commit_turn(backends, "s1", 1, "t2", [_entry("again")])
    # Then the transcript holds every entry in commit order, tagged with turn and token
    view = await backends.records.load("s1")
    assert view is not None
    assert view.entries == (
        CommittedEntry(role="user", content="hi", data={"n": 2, "ok": True}, turn_id="t1", token=1),
        CommittedEntry(
            role="assistant", content="hello", data={"n": 5, "ok": True}, turn_id="t1", token=1
        ),
        CommittedEntry(
            role="user", content="again", data={"n": 5, "ok": True}, turn_id="t2", token=1
        ),
    )


async def test_commit_with_older_token_is_fenced_out(backends: Backends) -> None:
    # Given a stale holder committed under token 1, then a new holder provisioned under token 2
    await backends.records.provision("s1", "agent-a", 1)
    await commit_turn(backends, "s1", 1, "t1", [_entry("old holder")])
    await backends.records.provision("s1", "agent-a", 2)
    # When the stale holder commits again under token 1
    with pytest.raises(FencedOut):
        await commit_turn(backends, "s1", 1, "t2", [_entry("late write")])
    # Then nothing was appended, and the new holder still commits
    await commit_turn(backends, "s1", 2, "t3", [_entry("new holder")])
    view = await backends.records.load("s1")
    assert view is not None
    assert [(e.turn_id, e.token) for e in view.entries] == [("t1", 1), ("t3", 2)]


async def test_commit_on_missing_record_is_fenced_out(backends: Backends) -> None:
    # Given a session with no record
    # When a turn commits to it
    with pytest.raises(FencedOut):
        await commit_turn(backends, "s1", 1, "t1", [_entry("orphan")])
    # Then no record was created
    assert await backends.records.load("s1") is None


async def test_delete_removes_record_and_transcript(backends: Backends) -> None:
    # Given a provisioned session with history
    await backends.records.provision("s1", "agent-a", 1)
    await commit_turn(backends, "s1", 1, "t1", [_entry("hi")])
    # When it is deleted
    await backends.records.delete("s1")
    # Then it is gone, and a new provision binds afresh with an empty transcript
    assert await backends.records.load("s1") is None
    assert await backends.records.provision("s1", "agent-b", 2) == "agent-b"
    assert await backends.records.load("s1") == RecordView("s1", "agent-b", 2)


async def test_delete_missing_record_is_a_no_op(backends: Backends) -> None:
    # Given one provisioned session
    await backends.records.provision("s1", "agent-a", 1)
    # When a session without record is deleted
    await backends.records.delete("other")
    # Then nothing else changed
    assert await backends.records.load("s1") == RecordView("s1", "agent-a", 1)


async def test_binding_names_the_bound_agent_without_reading_the_transcript(
    backends: Backends,
) -> None:
    records = backends.records
    # Given no record, then a record bound to agent-a with entries
    assert await records.binding("s1") is None
    await records.provision("s1", "agent-a", 1)
    await commit_turn(backends, "s1", 1, "turn-1", [_entry("hello")])
    # When another agent provisions, the binding does not change
    await records.provision("s1", "agent-b", 2)
    # Then binding answers the first agent, and none after delete
    assert await records.binding("s1") == "agent-a"
    await records.delete("s1")
    assert await records.binding("s1") is None


async def test_a_load_after_a_version_reads_only_what_was_committed_since(
    backends: Backends,
) -> None:
    # Given three committed entries (version 3)
    await backends.records.provision("s1", "agent-a", 1)
    nested = TranscriptEntry(
        role="assistant", content="x", data={"msg": {"parts": [1, {"a": None}]}}
    )
    await commit_turn(backends, "s1", 1, "t1", [_entry("hi"), nested])
    await commit_turn(backends, "s1", 1, "t2", [_entry("again")])
    # Then a load after version 2 reads the third only, and every load tells the version
    whole = await backends.records.load("s1")
    since = await backends.records.load("s1", after=2)
    nothing = await backends.records.load("s1", after=3)
    beyond = await backends.records.load("s1", after=10)
    assert whole is not None and since is not None and nothing is not None and beyond is not None
    assert [e.content for e in whole.entries] == ["hi", "x", "again"]
    assert whole.entries[1].data == {"msg": {"parts": [1, {"a": None}]}}  # (structure kept)
    assert [e.content for e in since.entries] == ["again"]
    assert nothing.entries == beyond.entries == ()
    assert whole.version == since.version == nothing.version == beyond.version == 3
    with pytest.raises(ValueError, match="after: must be a transcript version"):
        await backends.records.load("s1", after=-1)


async def test_a_finish_answers_the_version_its_commit_made_even_when_run_again(
    backends: Backends,
) -> None:
    await backends.records.provision("s1", "agent-a", 1)
    await commit_turn(backends, "s1", 1, "t0", [_entry("first")])
    idem = backends.idempotency
    assert await idem.put_if_absent("s1", "k1", "t1", "h", "node-a", 60.0, 3600.0) is None
    done = Outcome(turn_id="t1", ok=True, executed_by="node-a")
    commit = StagedCommit(1, (_entry("a"), _entry("b")), partial=True)
    finished = await backends.hotpath.finish("s1", "k1", "node-a", done, 3600.0, commit)
    # A rerun of the same call (its reply lost) answers the same version, appending nothing
    again = await backends.hotpath.finish("s1", "k1", "node-a", done, 3600.0, commit)
    plain = Outcome(turn_id="t2", ok=True, executed_by="node-a")
    assert await idem.put_if_absent("s1", "k2", "t2", "h", "node-a", 60.0, 3600.0) is None
    uncommitted = await backends.hotpath.finish("s1", "k2", "node-a", plain, 3600.0)
    assert (finished.recorded, finished.version) == (True, 3)
    assert (again.recorded, again.version) == (True, 3)
    assert (uncommitted.recorded, uncommitted.version) == (True, None)
    view = await backends.records.load("s1")
    assert view is not None and view.version == 3
    assert [(e.content, e.partial) for e in view.entries] == [
        ("first", False),
        ("a", True),
        ("b", True),
    ]
