"""The README's demo, measured: ``python prune.py`` with no arguments (``configs/prune/demo.yaml``: the reference ViT
on Fashion-MNIST, offline), its report kept as the results the README quotes.

    python benchmarks/demo_prune_report.py   # benchmarks/results/demo_prune_report.{json,md}, demo_plots/*.png
    python benchmarks/demo_prune_report.py --out /tmp/demo -- --data.init_args.max_samples=48   # prune.py options

Runs ``prune.py``'s main in this process (so the record lists every file the run imported), its run folder in a
temporary directory, then keeps the run's ``report.json`` (with this run's provenance), its ``report.md`` and the
plots the README shows. The README's demo table and its timings come from this file (``docs/claims.yaml``).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, parse_args, write_results  # noqa: E402

def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS / "demo_prune_report",
                        help="results prefix (the plots go to demo_plots/ beside it)")
    parser.add_argument("prune_options", nargs="*", help="options for prune.py (after --), e.g. to shrink a smoke run")
    args = parse_args(parser, argv)
    plots = args.out.parent / "demo_plots"
    from snapvit_pl.cli import prune_main

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        code = prune_main(["--out_dir", str(run), *args.prune_options])
        if code != 0:
            raise SystemExit(f"error: python prune.py exited with {code}")
        report = json.loads((run / "report.json").read_text())
        markdown = (run / "report.md").read_text().replace("](plots/", f"]({plots.name}/")
        plots.mkdir(exist_ok=True)
        for figure in sorted((run / "plots").glob("*.png")):
            shutil.copyfile(figure, plots / figure.name)
    write_results(args.out, report, markdown, args, round_values=False)
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.md')}; plots in {plots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
