"""`python -m stickless ...`: the same commands as the `stickless` console script."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
