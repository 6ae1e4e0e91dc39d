"""Issue 55's selection of the weight correction: every variant on the development models, as cut and corrected.

    python benchmarks/correction_selection.py \\
        --runs sgpt256=benchmarks/results/research/issue55/sgpt256_cs.json,sgpt256=...sgpt256_rest.json,... \\
        --baseline sgpt256 --out benchmarks/results/research/selection_issue55

Each run is a ``compare_methods.py --split holdout --methods ours --correction both`` run (the default score, each
pair's parameter count split by the fitness, held-out train images, 3 seeds) whose only difference is its correction
settings (``--override=--correction...``, read back from the run). The tables give, per development model and kept
parameter fraction, the mean ± std over seeds of each metric as cut and after each variant's correction, and how much
of the dense model's accuracy each variant loses at the deepest cut against ``--baseline``. ``--cost`` also times one
correction of each variant (its settings, the deepest pair's sub-network of seed 0) on each listed model, with its
peak memory, one torch thread.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, display, machine_info, model_overrides, parse_args, prune_setup, write_results  # noqa: E402
from benchmarks.compare_methods import REPORTED  # noqa: E402

AS_CUT = "as cut"
#: The correction defaults every run of issue 55 was made with (before the defaults changed to 1000 calibration
#: images and reconstruct_lr 1e-3): a variant's description and its cost measurement name those its run used.
RUN_DEFAULTS = {"--correction.num_samples": "256", "--correction.reconstruct_lr": "0.0003"}


def _as_run(overrides: list[str]) -> list[str]:
    """A run's correction overrides with the defaults it ran with made explicit (the rate only where it stepped)."""
    given = {o.split("=", 1)[0] for o in overrides}
    implied = [f"{key}={value}" for key, value in RUN_DEFAULTS.items() if key not in given and (
        key != "--correction.reconstruct_lr" or "--correction.reconstruct_steps" in given)]
    return overrides + implied


def load_runs(runs: list[tuple[str, Path]]) -> dict[str, Any]:
    """``{model: {"dense": metrics, "cells": {(pair, variant): {metric: [values over seeds]}}}}`` and each variant's
    correction overrides (a variant may come from several runs: other models)."""
    models: dict[str, Any] = {}
    overrides: dict[str, list[str]] = {}
    for variant, path in runs:
        report = json.loads(Path(path).read_text())
        overrides[variant] = _as_run([o for o in report["settings"]["overrides"] if o.startswith("--correction.")])
        for model, entry in report["models"].items():
            slot = models.setdefault(model, {"dense": entry["dense"], "cells": {}, "kept": {}})
            for row in entry["rows"]:
                pair = tuple(row["pair"])
                name = variant if row["corrected"] else AS_CUT
                slot["kept"][pair] = row["params"] / entry["dense"]["params"]
                cell = slot["cells"].setdefault((pair, name), {})
                if name == AS_CUT and cell.get("_from", variant) != variant:
                    continue  # the models as cut are the same in every run: the first run's
                cell["_from"] = variant
                for key, _ in REPORTED:
                    if row.get(key) is not None:
                        cell.setdefault(key, []).append(100 * row[key])
    return {"models": models, "overrides": overrides}


def _cell(values: Optional[list[float]]) -> str:
    if not values:
        return "n/a"
    spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.2f}{spread}"


def markdown(report: dict[str, Any]) -> str:
    variants = list(report["overrides"])
    lines = ["# Issue 55: which weight correction (development models, held-out train images, 3 seeds)", "",
             "The default score (`ours`), each pair's parameter count split by the fitness, as `prune.py` does; "
             "accuracy in percent, mean ± std over seeds (the seed draws the pruning, fitness and calibration images). "
             "Variants (their `--correction` settings besides `--correction.enabled true`):", ""]
    lines += [f"- **{v}**: `{' '.join(report['overrides'][v]) or '(the defaults)'}`" for v in variants]
    for key, title in REPORTED:
        rows = []
        for model, slot in report["models"].items():
            if slot["dense"].get(key) is None:
                continue
            for pair in sorted({p for p, _ in slot["cells"]}, key=lambda p: -slot["kept"][p]):
                cells = [_cell(slot["cells"].get((pair, v), {}).get(key)) for v in [AS_CUT, *variants]]
                rows.append(f"| {model} | {slot['kept'][pair]:.0%} | {100 * slot['dense'][key]:.2f} | "
                            + " | ".join(cells) + " |")
        if rows:
            lines += ["", f"## {title}", "", "| model | kept params | dense | as cut | " + " | ".join(variants) + " |",
                      "|---|---:|---:|---:|" + "---:|" * len(variants), *rows]
    base = report["baseline"]
    lines += ["", f"## Loss against the dense model at the deepest cut, as a share of {base}'s loss", "",
              "Below 0.50: the loss at least halved (issue 55's goal for clutter's own head and ssl_clutter's k-NN).",
              "", "| model | metric | " + " | ".join(variants) + " |", "|---|---|" + "---:|" * len(variants)]
    for model, slot in report["models"].items():
        deepest = min({p for p, _ in slot["cells"]}, key=lambda p: slot["kept"][p])
        for key, title in REPORTED:
            if slot["dense"].get(key) is None:
                continue
            dense = 100 * slot["dense"][key]
            losses = {v: dense - statistics.fmean(slot["cells"][(deepest, v)][key])
                      for v in variants if slot["cells"].get((deepest, v), {}).get(key)}
            if base not in losses:
                continue
            lines.append(f"| {model} | {title} | " + " | ".join(
                f"{losses[v] / losses[base]:.2f}" if v in losses else "n/a" for v in variants) + " |")
    if report.get("cost"):
        lines += ["", "## What one correction costs (the deepest pair's model, seed 0, one torch thread)", "",
                  "| model | variant | calibration images | seconds | peak memory (MiB) |", "|---|---|---:|---:|---:|"]
        lines += [f"| {c['model']} | {c['variant']} | {c['images']} | {c['seconds']:.1f} | {c['peak_mb']:.0f} |"
                  for c in report["cost"]]
    runs = ", ".join(f"{v}: `{p}`" for v, p in report["runs"])
    lines += ["", f"Runs: {runs}."]
    return "\n".join(lines) + "\n"


def measure_costs(report: dict[str, Any], models: list[str]) -> list[dict[str, Any]]:
    """Seconds and peak memory of one correction of each variant on each of ``models`` (the deepest pair)."""
    from dataclasses import replace

    from benchmarks.compare_methods import fitness_images, method_scores
    from snapvit_pl.device import PeakMemory
    from snapvit_pl.elastic import Budget, CostModel
    from snapvit_pl.pipeline import Correction, choose_splits, split_table
    from benchmarks.common import Progress

    torch.set_num_threads(1)
    rows = []
    for model_name in models:
        slot = report["models"][model_name]
        deepest = min({p for p, _ in slot["cells"]}, key=lambda p: slot["kept"][p])
        for variant, overrides in report["overrides"].items():
            setup = prune_setup(*model_overrides(model_name), "--data.init_args.seed=0", "--search.seed=0", *overrides)
            scores, _ = method_scores("ours", setup, Progress(), {})
            cost = CostModel(setup.model)
            budget = Budget(params=cost.params(scores.subnet(Budget(mlp_ratio=deepest[0], head_ratio=deepest[1]),
                                                             cost)[0]))
            shared: dict[str, Any] = {}
            scores.splits = split_table(choose_splits(setup.model, fitness_images(setup, shared), scores, [budget],
                                                      setup.search, replace(setup.export, split_grid=0), cost))
            subnet = scores.subnet(budget, cost)[0]
            images = setup.datamodule.unlabeled_images(setup.correction.num_samples, setup.correction.batch_size)
            memory = PeakMemory("cpu").start()
            started = time.perf_counter()
            Correction(setup.correction, images)(setup.model, subnet)
            rows.append({"model": model_name, "variant": variant, "images": len(images),
                         "seconds": time.perf_counter() - started, "peak_mb": memory.peak_mb()})
            print(f"{model_name} {variant}: {rows[-1]['seconds']:.1f} s", flush=True)
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="comma-separated VARIANT=compare_methods.json (a variant may be "
                        "named once per run, each run other models)")
    parser.add_argument("--baseline", required=True, help="the variant the losses are compared with")
    parser.add_argument("--cost", default="", help="comma-separated models to time one correction of each variant on")
    parser.add_argument("--out", default=str(RESULTS / "research" / "selection_issue55"))
    args = parse_args(parser, argv)
    runs = [tuple(item.split("=", 1)) for item in args.runs.split(",")]
    loaded = load_runs([(v, Path(p)) for v, p in runs])
    report = {**loaded, "baseline": args.baseline, "runs": [[v, display(Path(p))] for v, p in runs],
              "machine": machine_info()}
    report["cost"] = measure_costs(report, args.cost.split(",")) if args.cost else []
    serialisable = {**report, "models": {m: {"dense": s["dense"], "kept": {str(list(p)): k for p, k in s["kept"].items()},
                                             "cells": [{"pair": list(p), "variant": v,
                                                        **{k: val for k, val in c.items() if k != "_from"}}
                                                       for (p, v), c in s["cells"].items()]}
                                         for m, s in report["models"].items()}}
    write_results(Path(args.out), serialisable, markdown(report), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
