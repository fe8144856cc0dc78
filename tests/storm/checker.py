"""The one checker of the storms' invariants, over a run's `History` and the stores it left.

1. Serialization and fencing: a session's turns never run at the same time (but for the
   overlap the README allows, see `overlaps`), a turn runs at most once, committed transcripts
   never interleave, carry non-decreasing fencing tokens and hold only what a turn that
   returned normally staged.
2. One answer per submit: every submit is refused for a reason the run explains or answered
   exactly once (a result for its own turn, a failure the run allows, RouterClosedError only from
   a killed node), within its bound; a killed node answers its own callers only with
   RouterClosedError.
3. At most once per key: every caller of a turn hears the same story, a turn said to have
   committed nothing did not, a key succeeds once and never runs again after a caller saw it
   succeed, and it commits again only after the commit's holder was lost.
4. Nothing silently lost: inboxes drain and every reservation settles, agreeing with what the
   callers were told.
5. Liveness (where the rules give a bound): no session stays unserved longer than it while a
   healthy node exists (see `liveness`).
6. Stream completeness (for a run that kept streams open, see `streams`): every frame logged
   for a turn reached every stream open on its session, once, in order, or the stream reported
   a gap.

What an environment may legitimately answer (failure codes, refusals during a store restart,
bounds) comes with it as `rules.Rules`. Symptoms of the bugs in `known_bugs` are listed as known-bug
hits while their switch stands, else they fail the run like any other violation.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from stickless.backends.base import Backends

from . import liveness, overlaps
from .answers import AnswerChecks
from .keys import KeyChecks
from .loss import LossChecks
from .records import parse
from .streams import stream_violations


class Checker(AnswerChecks, KeyChecks, LossChecks):
    """Checks the invariants over a `History`; collects violations, counts what it saw (the
    families of invariants 2-4 live in answers.py, keys.py and loss.py; the state and the
    verdicts they share in verdicts.py)."""

    async def check(self, backends: Backends) -> None:
        await self.fenced_transcripts(backends)
        self.serialization()
        self.one_answer_per_submit()
        self.at_most_once_per_key()
        await self.nothing_lost(backends)
        if self.rules.serve_within is not None:
            for message in liveness.liveness(self.history, self.rules.serve_within):
                self.fail("5 liveness", message)
        await self.streams_complete(backends)

    async def streams_complete(self, backends: Backends) -> None:
        """Every frame logged for a turn reached every stream kept open on its session, once,
        in order, or the stream reported a gap (tests/storm/streams.py)."""
        for message in await stream_violations(self.history.streams, backends):
            self.known("STREAM_COMPLETENESS_BUG", "stream_completeness", message)
        self.counts["streams"] = len(self.history.streams)
        self.counts["streamed_frames"] = sum(len(r.frames) for r in self.history.streams)

    def serialization(self) -> None:
        """A session's turns never run at the same time but for the window the README allows
        (tests/storm/overlaps.py); a turn runs at most once. Needs `fenced_transcripts` first
        (an overlap is allowed only for an earlier turn that committed nothing)."""
        verdict = overlaps.serialization(
            self.history, self.committed, self.rules.lease_ttl, self.rules.attempts_rerun
        )
        for invariant, message in verdict.violations:
            self.fail(invariant, message)
        self.allowed_overlaps = verdict.allowed
        self.counts["executions"] = len(self.history.executions)
        self.counts["executions_cut_by_kill"] = sum(
            1 for e in self.history.executions if e.end is None and e.node in self.killed
        )
        self.counts["max_concurrency"] = verdict.max_concurrency
        self.counts["allowed_overlaps"] = len(verdict.allowed)

    async def fenced_transcripts(self, backends: Backends) -> None:
        """Committed transcripts: tokens never decrease, a turn's entries are contiguous, and
        only a turn that returned normally committed, and only what it (or a message taken
        into it) staged."""
        may_commit: dict[str, set[str]] = defaultdict(set)
        for execution in self.history.executions:
            may_commit[execution.turn_id].update(execution.staged)
        for injection in self.history.injections:
            may_commit[injection.host_turn_id].add(injection.text)
        entries = 0
        for session_id in self.history.sessions:
            record = await backends.records.load(session_id)
            if record is None:
                continue
            entries += len(record.entries)
            blocks: list[str] = []
            last_token = 0
            for entry in record.entries:
                turn_id = entry.turn_id
                if entry.token < last_token:
                    self.fail(
                        "1 fencing",
                        f"{session_id}: token {entry.token} after {last_token} ({turn_id})",
                    )
                last_token = max(last_token, entry.token)
                if not blocks or blocks[-1] != turn_id:
                    blocks.append(turn_id)
                self.committed.setdefault(turn_id, []).append(entry.content)
                if parse(entry.content.removeprefix("echo:"))[0] != session_id:
                    self.fail("1 fencing", f"{session_id} holds {entry.content!r}")
                elif turn_id in self.executed and entry.content not in may_commit[turn_id]:
                    self.fail(
                        "1 fencing", f"{session_id}: {entry.content!r} committed by {turn_id}"
                    )
            for turn_id, times in Counter(blocks).items():
                if times > 1:
                    self.fail("1 interleaving", f"{session_id}: turn {turn_id} split in {times}")
            for turn_id in dict.fromkeys(blocks):
                if turn_id not in self.returned:
                    self.fail(
                        "1 fencing", f"{session_id}: turn {turn_id} committed but never returned"
                    )
                else:
                    self.commits[(session_id, self.executed[turn_id].tag)].append(turn_id)
        self.counts["transcript_entries"] = entries
        self.counts["committed_turns"] = len(self.committed)
