"""``python -m aotune``."""

from aotune.cli import main

raise SystemExit(main())
