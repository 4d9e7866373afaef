"""Libraries built ahead of time: ``aotune build`` and ``aotune.load``; see :mod:`.build`."""
