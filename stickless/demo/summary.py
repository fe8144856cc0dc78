"""The demo's last scene: per-session and per-node tables of what happened."""

from __future__ import annotations

from .cluster import DemoError
from .state import EXECUTED_LOCALLY, FORWARDED, Demo


async def scene_summary(demo: Demo) -> None:
    """Per-session and per-node tables of what happened."""
    says, console, cluster, ledger = demo.says, demo.console, demo.cluster, demo.cluster.ledger
    records = demo.records
    here = ledger is not None  # the agents ran in this process: their ledger has more columns
    rows: list[list[object]] = []
    for sid in sorted({r.session_id for r in records}):
        mine = [r for r in records if r.session_id == sid]
        ran = [r for r in mine if not r.cached]
        ran_on = sorted({demo.label(r.executed_by) for r in ran if r.executed_by})
        row: list[object] = [
            sid,
            len(mine),
            sum(1 for r in mine if r.kind == FORWARDED),
            sum(1 for r in mine if r.cached),
        ]
        if ledger is not None:
            row.append(ledger.executions[sid])
        row += [
            sum(1 for r in ran if r.outcome == "ok"),
            sum(1 for r in ran if r.outcome not in ("ok", "pending")),
        ]
        if ledger is not None:
            row += [ledger.max_parallel[sid], ledger.opened[sid]]
        rows.append([*row, await cluster.committed(sid), ",".join(ran_on)])
    console.table(
        [
            "session",
            "submits",
            "forwarded",
            "cached",
            *(["turns run"] if here else []),
            "ok",
            "failed",
            *(["parallel", "handles"] if here else []),
            "entries",
            "ran on",
        ],
        rows,
    )
    if here:
        console.write(
            "  (turns run = agent executions; parallel = most turns of the session running at "
            "once;\n   handles = live sessions opened; entries = committed transcript entries)\n"
        )
    console.write("\n")
    split = says.cache_hits_column
    seen = {r.via for r in records} | {r.executed_by for r in records if r.executed_by}
    node_rows: list[list[object]] = []
    for node in sorted(seen | set(cluster.roster()), key=lambda n: (demo.label(n), n)):
        received = [r for r in records if r.via == node]
        local = [r for r in received if r.kind == EXECUTED_LOCALLY and not (split and r.cached)]
        node_rows.append(
            [
                demo.label(node),
                "killed" if node in demo.killed else "alive",
                len(received),
                len(local),
                sum(1 for r in received if r.kind == FORWARDED),
                *([sum(1 for r in received if r.cached)] if split else []),
                sum(1 for r in records if r.executed_by == node and not r.cached),
            ]
        )
    console.table(
        [
            says.noun,
            "state",
            "received",
            "executed locally",
            "forwarded",
            *(["cache hits"] if split else []),
            "turns run here",
        ],
        node_rows,
    )
    if ledger is not None:
        if any(ledger.max_parallel[sid] > 1 for sid in {r.session_id for r in records}):
            raise DemoError("some session ran two turns at once")
        console.line("check", "no session ever ran two turns at the same time")
    if "recreated" in demo.failover:
        console.line("failover", says.failover.format(**demo.failover))
