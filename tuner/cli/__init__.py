"""The ``tuner`` command: argparse over the Python API (:mod:`tuner.api`), and nothing else.

    python -m tuner tune attention --shape 4,16,4096,128 --dtype fp16 --causal

``commands`` parses and dispatches every command (``main`` here runs it: the console script's
entry); ``check``, ``export_dispatch``, ``export_torch`` and ``lint`` hold the arguments of
``tuner check``, ``tuner export-dispatch``, ``tuner export-torch`` and ``tuner lint``; ``text``
is what the commands print, one line each or JSON-ready data.
"""

from __future__ import annotations

from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The ``tuner`` command (``tuner.cli.commands.main``): its exit status."""
    from tuner.cli.commands import main as run

    return run(argv)
