"""The ``aotune`` script's entry point: takes Ctrl-C before the (slow) imports begin.

Until ``cli.main`` installs its own handler, Ctrl-C prints the same one line as later and exits
130, instead of a KeyboardInterrupt traceback from inside an import.
"""

from __future__ import annotations

import os
import signal
from typing import Any


def _interrupted_early(signum: int, frame: Any) -> None:
    os.write(2, b"error: interrupted\n")
    os._exit(130)


def run() -> None:
    """Run the command line in ``sys.argv`` and exit with its status."""
    signal.signal(signal.SIGINT, _interrupted_early)
    from aotune.cli import main

    raise SystemExit(main())
