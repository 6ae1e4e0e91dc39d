"""Issue 75's decision: is a correction never below the model as cut, on every development model, metric and cut?

    python benchmarks/correction_default.py \\
        --runs fit=benchmarks/results/research/issue75/fit_guard.json,recon=.../recon_guard.json \\
        --out benchmarks/results/research/correction_default

Each run is a ``compare_methods.py --split holdout --methods ours --correction both`` run whose only difference is
its ``--correction`` settings: every model is evaluated as cut and corrected in the same pass (the same sub-network,
the same evaluation images), so each seed gives a paired difference. A cell passes when the mean paired difference
(corrected minus as cut) is not below minus the seed spread (the larger standard deviation over seeds of the two
columns), the rule of docs/method.md, section 4. The tables also say what the held-out check kept (the whole model
corrected or as cut; each block's variant) and the correction's seconds per model in those runs (the machine was
shared by two runs: the cost table is ``correction_cost.py``'s).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, display, machine_info, parse_args, write_results  # noqa: E402
from benchmarks.compare_methods import REPORTED  # noqa: E402


def paired(report: dict[str, Any]) -> dict[str, Any]:
    """``{model: {"dense": metrics, "cells": {(pair, metric): {"cut": [...], "corrected": [...]}}, "kept": {pair:
    params share}, "checks": {pair: [correction summaries]}}}`` from one compare_methods report."""
    models: dict[str, Any] = {}
    for name, entry in report["models"].items():
        slot = models.setdefault(name, {"dense": entry["dense"], "cells": {}, "kept": {}, "checks": {}})
        for row in entry["rows"]:
            pair = tuple(row["pair"])
            slot["kept"][pair] = row["params"] / entry["dense"]["params"]
            if row["corrected"]:
                slot["checks"].setdefault(pair, []).append(row.get("correction") or {})
            for key, _ in REPORTED:
                if row.get(key) is not None:
                    cell = slot["cells"].setdefault((pair, key), {"cut": {}, "corrected": {}})
                    cell["corrected" if row["corrected"] else "cut"][row["seed"]] = 100 * row[key]
    return models


def verdict(cut: dict[int, float], corrected: dict[int, float]) -> dict[str, Any]:
    """Mean ± std of each column, the mean paired difference, the seed spread and whether the cell passes."""
    seeds = sorted(set(cut) & set(corrected))
    a, b = [cut[s] for s in seeds], [corrected[s] for s in seeds]
    spread = max(statistics.stdev(a), statistics.stdev(b)) if len(seeds) > 1 else 0.0
    difference = statistics.fmean(y - x for x, y in zip(a, b))
    return {"seeds": len(seeds), "cut": statistics.fmean(a), "cut_std": statistics.stdev(a) if len(a) > 1 else 0.0,
            "corrected": statistics.fmean(b), "corrected_std": statistics.stdev(b) if len(b) > 1 else 0.0,
            "difference": difference, "spread": spread, "passes": difference >= -spread}


def summary(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """What the held-out checks kept over seeds: models corrected, blocks per variant, seconds per model."""
    blocks: Counter = Counter()
    for check in checks:
        blocks.update(check.get("blocks_kept") or {})
    seconds = [c["seconds"] for c in checks if c.get("seconds") is not None]
    measured = [c["output_check"] for c in checks if c.get("output_check")]

    def mean(side: str, key: str) -> Optional[float]:
        values = [m[side][key] for m in measured if key in m[side]]
        return statistics.fmean(values) if values else None

    return {"models": len(checks), "corrected": sum(c.get("kept") == "corrected" for c in checks),
            "blocks_kept": dict(blocks), "seconds": statistics.fmean(seconds) if seconds else None,
            "steps_run": [sum(c["steps_run"]) for c in checks if c.get("steps_run")],
            **{f"{key}_{side}": mean(side, key) for key in ("drift", "neighbours") for side in ("as_cut", "corrected")}}


def build(runs: list[tuple[str, Path]]) -> dict[str, Any]:
    out: dict[str, Any] = {"variants": {}, "runs": [[v, display(p)] for v, p in runs]}
    for variant, path in runs:
        report = json.loads(path.read_text())
        models = paired(report)
        rows = []
        for model, slot in models.items():
            for (pair, key), cell in slot["cells"].items():
                if cell["cut"] and cell["corrected"]:
                    rows.append({"model": model, "pair": list(pair), "kept_params": slot["kept"][pair],
                                 "metric": key, "dense": 100 * slot["dense"][key],
                                 **verdict(cell["cut"], cell["corrected"]),
                                 "checks": summary(slot["checks"].get(pair, []))})
        overrides = [o for o in report["settings"]["overrides"] if o.startswith("--correction.")]
        out["variants"][variant] = {"overrides": overrides, "rows": rows,
                                    "passes": all(r["passes"] for r in rows), "source": display(path)}
    return out


def markdown(report: dict[str, Any]) -> str:
    titles = dict(REPORTED)
    lines = ["# Issue 75: the correction against the model as cut (development models, held-out train images)", "",
             "Each model evaluated as cut and corrected in the same pass; mean ± std over seeds (the seed draws the "
             "pruning, fitness and calibration images); `diff`: the mean paired difference, corrected minus as cut; "
             "`ok`: not below minus the seed spread (the larger std of the two columns). `kept`: models the output "
             "check kept corrected, of all; `blocks`: each pruned block's variant, over models and seeds; `drift` "
             "and `neighbours`: the output check on the held-out images, as cut -> corrected, means over seeds "
             "(`1 - mean cosine` to the dense embeddings; the share of each image's ten nearest held-out neighbours "
             "under the dense model kept, models without a classifier); `s/model`: the correction's seconds per "
             "model in these runs (other runs shared the 2-core machine)."]
    for variant, entry in report["variants"].items():
        lines += ["", f"## {variant}: `{' '.join(entry['overrides']) or '(the defaults)'}`", "",
                  f"Every cell passes: **{'yes' if entry['passes'] else 'no'}**.", "",
                  "| model | kept params | metric | dense | as cut | corrected | diff | spread | ok | kept | blocks "
                  "| drift | neighbours | s/model |", "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|"]
        order = {key: i for i, (key, _) in enumerate(REPORTED)}
        for r in sorted(entry["rows"], key=lambda r: (r["model"], -r["kept_params"], order[r["metric"]])):
            c = r["checks"]
            blocks = ", ".join(f"{k} {v}" for k, v in sorted(c["blocks_kept"].items())) or "-"
            seconds = f"{c['seconds']:.1f}" if c["seconds"] is not None else "-"
            drift, neighbours = (f"{c[f'{k}_as_cut']:.{d}f} -> {c[f'{k}_corrected']:.{d}f}"
                                 if c.get(f"{k}_as_cut") is not None else "-"
                                 for k, d in (("drift", 4), ("neighbours", 3)))
            lines.append(
                f"| {r['model']} | {r['kept_params']:.0%} | {titles[r['metric']]} | {r['dense']:.2f} | "
                f"{r['cut']:.2f} ± {r['cut_std']:.2f} | {r['corrected']:.2f} ± {r['corrected_std']:.2f} | "
                f"{r['difference']:+.2f} | {r['spread']:.2f} | {'yes' if r['passes'] else '**no**'} | "
                f"{c['corrected']}/{c['models']} | {blocks} | {drift} | {neighbours} | {seconds} |")
    runs = ", ".join(f"{v}: `{p}`" for v, p in report["runs"])
    return "\n".join(lines[:3] + summary_tables(report) + lines[3:] + ["", f"Runs: {runs}."]) + "\n"


def summary_tables(report: dict[str, Any]) -> list[str]:
    """Per variant, one line per model and metric: the paired difference (seed spread) at each cut, `no` where it is
    below minus the spread. A cut is an (mlp, head) pair; its header gives the mean kept parameter share."""
    titles = dict(REPORTED)
    order = {key: i for i, (key, _) in enumerate(REPORTED)}
    lines = []
    for variant, entry in report["variants"].items():
        shares: dict[tuple[float, ...], list[float]] = {}
        for r in entry["rows"]:
            shares.setdefault(tuple(r["pair"]), []).append(r["kept_params"])
        pairs = sorted(shares, key=lambda pair: -statistics.fmean(shares[pair]))
        lines += ["", f"## Summary, {variant}: corrected minus as cut (seed spread)", "",
                  "| model | metric | " + " | ".join(f"{statistics.fmean(shares[p]):.0%} of the parameters"
                                                     for p in pairs) + " |", "|---|---|" + "---:|" * len(pairs)]
        cells: dict[tuple[str, str], dict[tuple[float, ...], str]] = {}
        for r in entry["rows"]:
            cell = f"{r['difference']:+.2f} ({r['spread']:.2f})" + ("" if r["passes"] else " **no**")
            cells.setdefault((r["model"], r["metric"]), {})[tuple(r["pair"])] = cell
        for (model, metric), row in sorted(cells.items(), key=lambda kv: (kv[0][0], order[kv[0][1]])):
            lines.append(f"| {model} | {titles[metric]} | " + " | ".join(row.get(p, "n/a") for p in pairs) + " |")
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="comma-separated VARIANT=compare_methods.json")
    parser.add_argument("--out", default=str(RESULTS / "research" / "correction_default"))
    args = parse_args(parser, argv)
    report = {**build([(v, Path(p)) for v, p in (item.split("=", 1) for item in args.runs.split(","))]),
              "machine": machine_info()}
    write_results(Path(args.out), report, markdown, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
