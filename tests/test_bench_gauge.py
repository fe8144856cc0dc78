"""The bench's `ClientGauge` closes even when its in-flight Redis call ignores a cancel.

On Python 3.11 redis-py writes a command under `asyncio.wait_for`, which swallows a cancel that
lands once the write has finished but before the waiting task resumed: the sampler then went on
sampling forever and `stickless bench --only sessions` hung in the gauge's exit, after its
rounds, with the event loop idle between samples.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from stickless.bench._common import ClientGauge


async def test_gauge_closes_while_its_call_ignores_a_cancel(redis_url: str) -> None:
    gauge = ClientGauge(redis_url, every=0.001)
    real_info = gauge._client.info
    in_flight, release, sampled_again = asyncio.Event(), asyncio.Event(), asyncio.Event()
    calls = 0

    async def info(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > 1:  # (a sample after the exit: the test has failed; wait to be cancelled)
            sampled_again.set()
            await asyncio.Event().wait()
        # The first call is a real INFO that answers whatever cancel comes meanwhile, as
        # redis-py's write under Python 3.11's wait_for may: its caller gets the answer.
        answer = asyncio.ensure_future(real_info(*args))
        in_flight.set()
        while True:
            try:
                await release.wait()
                return await asyncio.shield(answer)
            except asyncio.CancelledError:
                continue

    gauge._client.info = info  # type: ignore[method-assign]
    await gauge.__aenter__()
    await in_flight.wait()
    closing = asyncio.ensure_future(gauge.__aexit__(None, None, None))
    again = asyncio.ensure_future(sampled_again.wait())
    try:
        await asyncio.sleep(0)  # the exit's first step: the sampler is told to stop
        release.set()
        # Before the fix the cancel was swallowed and the sampler went on: another INFO came
        # and the exit never returned. Now the exit returns once the call in flight answered.
        done, _ = await asyncio.wait({closing, again}, return_when=asyncio.FIRST_COMPLETED)
        assert closing in done, "the gauge kept sampling after its exit"
        assert calls == 1
        assert gauge.peak >= 1
    finally:
        again.cancel()
        if not closing.done():
            assert gauge._task is not None
            gauge._task.cancel()
            closing.cancel()
            with contextlib.suppress(BaseException):
                await closing
            await gauge._client.aclose()
