"""How each kind of demo cluster tells the shared scenes.

The scenes are written once (`scenes.py`); the in-process demo and the Ray demo differ only in
the words below and in a few choices (which session a scene uses, which node a turn enters
through, which optional lines are shown). Templates are `str.format` strings; the fields each
takes are named where it is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from .agent import STORY


@dataclass(frozen=True)
class Narration:
    """The wording and the per-cluster choices of the scenes."""

    #: What one member of the cluster is called ("node", "router").
    noun: str
    #: Scene titles, in scene order.
    titles: tuple[str, ...]
    #: Width of a node label in submit and result lines, and how much of a result is shown.
    label_width: int
    excerpt: int
    #: The long reply that scene 3 interrupts and scene 5 crashes in the middle of.
    story: str
    #: Scene 1's opening note.
    submits_note: str
    #: Printed as a subscription opens, before the submit (scenes 2 and 5): {sid} {node}.
    subscribed: str | None
    #: Printed after scene 2's submit, naming the subscriber that streams it: {sid} {node}.
    streams_it: str | None
    #: Scene 2's check: {node} (the subscriber) {deltas} {ran_on}.
    relayed: str
    #: How a failed line names the waiting caller: {node}.
    caller: str
    #: The session of scene 4 (the idempotent retry).
    retry_session: str
    #: Index, among the live nodes, of the node scene 5's session is first held by (and killed).
    crash_index: int
    #: Scene 5 shows the session's status as seen from the caller's node.
    holder_status: bool
    #: Scene 5's kill line: {holder} {caller}.
    kill: str
    #: Scene 5's check after the crash: {committed}.
    crash_committed: str
    #: Scene 5's next turn enters through the subscriber's node (else through the caller's).
    next_via_watcher: bool
    #: Scene 5's last check: {survivor} {history} {now} {committed}, and {placed} {served}
    #: (seconds from the kill to the next turn's placement and to its answer).
    survivor: str
    #: The summary's per-node table counts cache answers in a column of their own (else they
    #: count as executed locally, the kind the submit reported).
    cache_hits_column: bool
    #: Clusters that replace a killed node: scene 5's line for it ({node} {after}) and the
    #: summary's failover line ({holder_lost} {next_placed} {next_served} {recreated}).
    reconciled: str = ""
    failover: str = ""


#: The long reply of the in-process demo.
IN_PROCESS_STORY = (
    "Once upon a time a request landed on a node that did not hold its session, so the node "
    "forwarded it to the holder, which streamed every word back to whoever was listening, "
    "anywhere in the cluster, until somebody pressed stop"
)

#: `stickless demo`: routers of one process over shared in-memory backends (or one Redis).
IN_PROCESS = Narration(
    noun="node",
    titles=(
        "concurrent submits through different nodes",
        "streaming to a subscriber on another node",
        "interrupt from a node that does not hold the session",
        "idempotent retry answered from the cache",
        "the holder is killed mid-turn",
        "summary",
    ),
    label_width=7,
    excerpt=44,
    story=IN_PROCESS_STORY,
    submits_note="3 sessions x 3 messages, submitted all at once; each session's messages "
    "enter through different nodes",
    subscribed="{sid:<11} subscriber opened on {node}",
    streams_it=None,
    relayed="subscriber on {node} got {deltas} text deltas from a turn that ran on {ran_on} "
    "(a remote subscriber)",
    caller="caller on {node}",
    retry_session="chat-1",
    crash_index=0,
    holder_status=True,
    kill="{holder} crashes mid-turn (no release, no announcement); caller waits on {caller}",
    crash_committed="{committed} committed entries in the record store after the crash",
    next_via_watcher=True,
    survivor="next turn served by survivor {survivor}; it saw {history} committed entries of "
    "earlier turns; {now} committed now",
    cache_hits_column=True,
)

#: `stickless demo --ray N`: one router actor per node of a local Ray cluster, over Redis.
ON_RAY = Narration(
    noun="router",
    titles=(
        "submits through different routers",
        "streaming to a subscriber on another router",
        "interrupt from a router that does not hold the session",
        "idempotent retry answered from the cache",
        "the holder's router actor is killed mid-turn",
        "summary",
    ),
    label_width=8,
    excerpt=40,
    story=STORY,
    submits_note="3 sessions x 3 messages at once; each session's messages enter through "
    "different routers (different Ray nodes)",
    subscribed=None,
    streams_it="{sid:<11} {node} streams it (Ray streaming generator)",
    relayed="router {node} relayed {deltas} text deltas of a turn that ran on {ran_on}",
    caller="caller via {node}",
    retry_session="chat-retry",
    crash_index=-1,
    holder_status=False,
    kill="ray.kill(router {holder}) mid-turn; the caller waits via {caller}",
    crash_committed="{committed} committed entries after the kill",
    next_via_watcher=False,
    survivor="next turn served by survivor {survivor}: placed {placed:.2f}s, answered "
    "{served:.2f}s after the kill; it saw the {committed} committed entries",
    cache_hits_column=False,
    reconciled="the reconciler started router {node} on the same Ray node {after:.2f}s after "
    "the kill (a new incarnation)",
    failover="ray.kill -> caller's HOLDER_LOST {holder_lost:.2f}s; -> next turn placed "
    "{next_placed:.2f}s, answered {next_served:.2f}s (it streams for a while); -> router "
    "recreated {recreated:.2f}s",
)
