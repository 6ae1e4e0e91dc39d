"""``python -m snapvit_pl.extract``: the ``extract`` command (:mod:`snapvit_pl.cli.extract`)."""
import sys

from .cli.extract import main

if __name__ == "__main__":
    sys.exit(main())
