"""``python -m aotune``."""

from aotune.entry import run

run()
