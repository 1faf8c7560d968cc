"""The ``tuner`` command: argparse over the Python API (:mod:`tuner.api`), and nothing else.

    python -m tuner tune attention --shape 4,16,4096,128 --dtype fp16 --causal

``main`` parses and dispatches every command; ``check`` and ``export_dispatch`` hold the
arguments of ``tuner check`` and ``tuner export-dispatch``; ``text`` is what the commands
print, one line each or JSON-ready data.
"""
