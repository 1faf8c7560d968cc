"""``python -m tuner ...`` is the ``tuner`` command."""

import sys

try:
    from tuner.cli.commands import main
except KeyboardInterrupt:  # Ctrl-C while the command is still being imported
    print("tuner: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
