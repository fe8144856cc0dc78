"""The frames of a turn whose holder was lost stay orderable: its late terminal frame has a seq
above its earlier frames, and each turn_started names the lease it runs under, so a reader can
tell the lost turn ended before the next one began."""

from __future__ import annotations

from stickless import FailureCode

from .agents import Journal, req
from .conftest import make_cluster


async def test_a_lost_turns_terminal_frame_orders_after_its_frames_and_before_the_next_turn(
    journal: Journal,
) -> None:
    async with make_cluster(journal, nodes=2, lease_ttl=1.0, lease_extend_interval=0.3) as cluster:
        holder, survivor = cluster.nodes
        text = "lost words here"
        journal.gate(text)
        lost = await holder.submit(req("s1", text))
        await journal.entered[text].wait()
        # Given the holder of a running turn crashes
        await cluster.kill(holder)
        # When the next turn runs on the survivor
        following = await survivor.submit(req("s1", "next"))
        await following.result
        # Then the lost turn's terminal frame comes after all of its own frames by seq
        frames = await cluster.backends.events.read("s1", None, 1000)
        of_lost = [f for f in frames if f.turn_id == lost.turn_id]
        terminal = [f for f in of_lost if f.type == "turn_failed"]
        assert [f.code for f in terminal] == [FailureCode.HOLDER_LOST]
        assert terminal[0].seq > max(f.seq for f in of_lost if f.type != "turn_failed")
        # And the next turn's start names a newer lease than the lost turn's start
        starts = {f.turn_id: f for f in frames if f.type == "turn_started"}
        assert starts[following.turn_id].token > starts[lost.turn_id].token
