"""The demo's output: timestamped, labelled lines written to stdout as things happen."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence


class Console:
    """Timestamped, labelled lines written to stdout as things happen."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def elapsed(self) -> float:
        """Seconds since the demo started."""
        return time.monotonic() - self._t0

    def _stamp(self) -> str:
        return f"[{self.elapsed():6.2f}s]"

    def write(self, text: str) -> None:
        """Write text as it is (no stamp, no label)."""
        sys.stdout.write(text)
        sys.stdout.flush()

    def line(self, tag: str, text: str = "") -> None:
        """Print one labelled line at once."""
        self.write(f"{self._stamp()} {tag:<10} {text}".rstrip() + "\n")

    def begin(self, tag: str, text: str) -> None:
        """Start a line that later `more` calls extend (used for streamed text)."""
        self.write(f"{self._stamp()} {tag:<10} {text}")

    def more(self, text: str) -> None:
        """Append to the line opened by `begin`."""
        self.write(text)

    def end(self, text: str = "") -> None:
        """Finish the line opened by `begin`."""
        self.write(text + "\n")

    def header(self, title: str) -> None:
        """Print a scene banner."""
        bar = "=" * max(0, 78 - len(title) - 4)
        self.write(f"\n== {title} {bar}\n")

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        """Print rows as aligned plain-text columns."""
        cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
        widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
        rule = "  ".join("-" * w for w in widths)
        out: list[str] = []
        for index, row in enumerate(cells):
            out.append(
                "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            )
            if index == 0:
                out.append("  " + rule)
        self.write("".join(f"{text}\n" for text in out))
