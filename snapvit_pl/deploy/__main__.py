"""``python -m snapvit_pl.deploy``: the ``deploy`` command (:mod:`snapvit_pl.cli.deploy`)."""
import sys

from ..cli.deploy import main

if __name__ == "__main__":
    sys.exit(main())
