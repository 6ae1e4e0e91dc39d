"""The comparison at deep cuts, every method given the default correction (issue 55).

    python benchmarks/compare_methods_deep.py --models clutter,ssl_clutter \
        --out benchmarks/results/compare_methods_runs/deepfit_clutter_ssl      # one run (one process per group)
    python benchmarks/compare_methods_deep.py --merge RUN.json [RUN.json ...]  # benchmarks/results/compare_methods_deep.*
    python benchmarks/compare_methods_deep.py --quick                          # smoke run

A run is ``compare_methods.py``'s, with the deep-cut settings (:data:`DEEP`): the development models at the paper's
four deepest (mlp, head) pairs (51, 41, 32, 23% of the parameters), the default score in one and three stages, label
Fisher, SNIP-magnitude and weight magnitude, 3 seeds, 5000 test images and a 5000-image k-NN / probe memory, each
model as cut and after ``prune.py``'s default correction, named explicitly (``--correction.method=dense_fit``: each
pruned block's ``attn.proj`` / ``mlp.fc2`` refitted to the dense model's output of that block), the same calibration
images for every method. ``--merge`` writes the report from finished runs, naming the correction the runs were given
(every run must have been given the same one); ``compare_methods.py``'s own report names the SparseGPT-style update,
the correction of the runs it merges.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchmarks.compare_methods as compare_methods  # noqa: E402
from benchmarks.common import RESULTS, parse_args  # noqa: E402

#: The correction every method is given, as a prune.py override (recorded in each run's settings).
CORRECTION = "dense_fit"
#: compare_methods.py's arguments for a deep-cut run.
DEEP = ["--seeds", "0,1,2", "--methods", "ours,ours_stages3,label_fisher,snip_magnitude,magnitude",
        "--pairs", "0.55,0.4;0.65,0.5;0.75,0.6;0.85,0.65", "--train-samples", "5000", "--val-samples", "5000",
        f"--override=--correction.method={CORRECTION}"]
#: How each correction method is named in the report (what ``+correction`` means).
DESCRIBED = {
    "dense_fit": "the default correction, `dense_fit` (each pruned block's `attn.proj` / `mlp.fc2` refitted, weight and "
                 "bias, to the dense model's output of that block, residual stream included; `--correction.enabled "
                 "true --correction.method dense_fit`,",
    "sparsegpt": "the SparseGPT-style correction (`--correction.enabled true --correction.method sparsegpt`,",
}
#: The words of compare_methods.py's report that name the correction (the SparseGPT-style update, its runs').
NAMED = "the SparseGPT-style correction (`--correction.enabled true`,"
#: compare_methods.py's report (this script's names the correction in it).
REPORT = compare_methods.markdown


def correction_of(report: dict[str, Any]) -> str:
    """The correction method a run was given (its ``--correction.method`` override; ``sparsegpt`` without one: the
    default when compare_methods.py's runs were made).

    Raises:
        ValueError: an override names a method this report cannot describe.
    """
    methods = [o.split("=", 1)[1] for o in report["settings"].get("overrides", []) if o.startswith("--correction.method=")]
    method = methods[-1] if methods else "sparsegpt"
    if method not in DESCRIBED:
        raise ValueError(f"a run was given correction.method {method}; this report describes {', '.join(DESCRIBED)}")
    return method


def markdown(report: dict[str, Any], method: str) -> str:
    """compare_methods.py's report, with the correction ``method`` named."""
    text = REPORT(report)
    if NAMED not in text:
        raise ValueError("compare_methods.py's report no longer names its correction as this script expects: "
                         "update NAMED")
    return text.replace(NAMED, DESCRIBED[method])


def merge(paths: list[Path], out_prefix: Path, mixed_baselines: bool = False) -> dict[str, Any]:
    """:func:`compare_methods.merge` of runs given one correction, its report naming it.

    Raises:
        ValueError: the runs were given different corrections (or the merge refuses them).
    """
    import json

    methods = {correction_of(json.loads(Path(p).read_text())) for p in paths}
    if len(methods) != 1:
        raise ValueError(f"the runs were given different corrections ({', '.join(sorted(methods))}): merge runs of one")
    (method,) = methods
    compare_methods.markdown = lambda report: markdown(report, method)  # the text compare_methods' writer writes
    try:
        return compare_methods.merge(paths, out_prefix, mixed_baselines=mixed_baselines)
    finally:
        compare_methods.markdown = REPORT


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                        help="merge finished runs into --out (default benchmarks/results/compare_methods_deep)")
    parser.add_argument("--out", default=None, help="output prefix")
    parser.add_argument("--mixed-baselines", action="store_true",
                        help="with --merge: merge runs made under different regression baselines, marked in the table")
    args, rest = parser.parse_known_args(argv)
    if args.merge:
        parse_args(parser, argv)  # (the command recorded in the results)
        try:
            merge(args.merge, Path(args.out) if args.out else RESULTS / "compare_methods_deep", args.mixed_baselines)
        except (OSError, ValueError, KeyError) as err:
            parser.error(f"cannot merge: {err}")
        return
    out = args.out or str(RESULTS / "compare_methods_runs" / ("deep_quick" if "--quick" in rest else "deep_run"))
    compare_methods.main(DEEP + rest + ["--out", out])  # (never compare_methods.py's default: its own report)


if __name__ == "__main__":
    main()
