"""`python -m stickless ...`: the same commands as the `stickless` console script."""

from .cli import main

raise SystemExit(main())
