"""The raw pub/sub publisher of the relay baseline: a small process that PUBLISHes stamped
messages with redis-py when told to on stdin.

Commands, one per line: ``<paced|burst> <channel> <count> <interval> <size>`` publishes `count`
messages of `size` bytes (``"<time.time_ns()>:"`` padded), paced `interval` seconds apart or
back to back, then ``END``, and answers ``DONE``; ``quit`` (or EOF) exits. Prints ``READY`` first.
"""

from __future__ import annotations

import asyncio
import sys

from .agent import stamped_text


async def main(url: str) -> int:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url, socket_timeout=10.0)
    loop = asyncio.get_running_loop()
    try:
        await client.ping()
        print("READY", flush=True)
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            parts = line.split()
            if not parts or parts[0] == "quit":
                return 0
            mode, channel, count, interval, size = parts
            pause = float(interval) if mode == "paced" else 0.0
            width = int(size)
            for _ in range(int(count)):
                await client.publish(channel, stamped_text(width).encode())
                if pause:
                    await asyncio.sleep(pause)
            await client.publish(channel, b"END")
            print("DONE", flush=True)
    finally:
        await client.aclose()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
