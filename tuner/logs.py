"""Where the tuner's log lines go: stderr, one format, a level for each of its loggers (the
command line's, and the job scheduler's child process, which logs as the server does)."""

from __future__ import annotations

import logging
import sys
from typing import Mapping

LOGGERS = ("tuner", "workers", "storage")


def log_to_stderr(levels: Mapping[str, int]) -> None:
    """Each named logger's lines on stderr as ``HH:MM:SS message``, at its level, and only there."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    for name, level in levels.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False
