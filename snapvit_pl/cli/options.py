"""``python -m snapvit_pl.cli.options``: write ``prune_options.json`` (``prune.py --help``'s option list and the
first screen's defaults, :mod:`snapvit_pl.cli.help`) from ``prune.py``'s parser; run it after changing an option,
a default or its docstring (``tests/cli/test_help.py`` fails until then)."""
from __future__ import annotations

import json
import sys
from typing import Optional

from .help import OPTIONS_FILE, render_options
from .prune import declared_option_hints, prune_parser


def main(argv: Optional[list[str]] = None) -> int:
    """Write ``prune_options.json``; returns the exit status."""
    from ..io import write_text_atomic

    write_text_atomic(OPTIONS_FILE, json.dumps(render_options(prune_parser(), declared_option_hints()), indent=1) + "\n")
    print(f"wrote {OPTIONS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
