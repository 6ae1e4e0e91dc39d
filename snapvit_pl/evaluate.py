"""``python -m snapvit_pl.evaluate``: the ``evaluate`` command (:mod:`snapvit_pl.cli.evaluate`)."""
import sys

from .cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
