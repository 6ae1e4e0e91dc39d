"""A budget cut later from a run's elastic scores against the same budget asked for up front (issue 55, point 5).

    python benchmarks/later_budgets.py --models clutter,ssl_clutter --seeds 0,1,2   # benchmarks/results/later_budgets.*
    python benchmarks/later_budgets.py --quick                                       # smoke run

For each development model and seed: the default scores (``ours``, as ``compare_methods.py`` computes them) of a run
whose budgets stop at ``--run-budgets`` (kept parameter fractions, with the default grid of splits,
``export.split_grid``) are cut at each ``--later`` fraction (what ``snapvit-pl extract`` does: the head ratio
recorded for that fraction, or interpolated between the two nearest grid points), and the same fraction is asked for up
front (``choose_splits`` with that budget: its whole window raced, no grid). Both models are evaluated as
``compare_methods.py`` evaluates (own head, linear probe, k-NN on ``--val-samples`` held-out images); the table shows
each pair's head ratios, the fitness drift of each choice and the accuracy difference. The split time of the run
with its grid is reported against the run's asked budgets alone (the grid's cost).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    MODELS, RESULTS, Progress, machine_info, model_overrides, parse_args, pct, prune_setup, write_results,
)
from benchmarks.compare_methods import (  # noqa: E402
    EVALUATION_SEED, REPORTED, CachedEvaluation, Settings, evaluation_data, fitness_images, method_scores,
)
from snapvit_pl.elastic import Budget, CostModel  # noqa: E402
from snapvit_pl.pipeline import EvaluationSettings, choose_splits, extract_models, split_table  # noqa: E402


def run(models: list[str], seeds: list[int], run_budgets: list[float], later: list[float], val_samples: int,
        train_samples: int, log: Progress) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    costs: list[dict[str, Any]] = []
    for model_name in models:
        evaluation = None
        for seed in seeds:
            setup = prune_setup(*model_overrides(model_name), f"--data.init_args.seed={seed}", f"--search.seed={seed}")
            if evaluation is None:
                has_head = bool(getattr(setup.model, "num_classes", 0))
                metrics = EvaluationSettings(metrics=["knn", "linear", *(["head"] if has_head else [])],
                                             train_samples=train_samples, val_samples=val_samples)
                eval_setup = prune_setup(*model_overrides(model_name), f"--data.init_args.seed={EVALUATION_SEED}")
                settings = Settings(models=[model_name], val_samples=val_samples, train_samples=train_samples,
                                    split="holdout")
                evaluation = CachedEvaluation(metrics, evaluation_data(eval_setup, settings), device=torch.device("cpu"))
            shared: dict[str, Any] = {}
            scores, _ = method_scores("ours", setup, log, shared)
            cost = CostModel(setup.model)
            images = fitness_images(setup, shared)
            asked = [Budget(params=k) for k in run_budgets]
            started = time.perf_counter()
            choose_splits(setup.model, images, scores, asked, setup.search, replace(setup.export, split_grid=0), cost)
            alone_s = time.perf_counter() - started
            started = time.perf_counter()
            run_choices = choose_splits(setup.model, images, scores, asked, setup.search, setup.export, cost)
            grid_s = time.perf_counter() - started
            costs.append({"model": model_name, "seed": seed, "asked_alone_s": alone_s, "with_grid_s": grid_s})
            run_table = split_table(run_choices)
            for keep in later:
                budget = Budget(params=keep)
                scores.splits = run_table
                (cut_later,) = extract_models(setup.model, scores, [budget], evaluation=evaluation, cost=cost)
                (choice,) = choose_splits(setup.model, images, scores, [budget], setup.search,
                                          replace(setup.export, split_grid=0), cost)
                scores.splits = split_table([choice])
                (cut_up_front,) = extract_models(setup.model, scores, [budget], evaluation=evaluation, cost=cost)
                drifts = {round(h, 6): d for h, _, d in choice.candidates}
                row = {"model": model_name, "seed": seed, "keep": keep,
                       "later": {"head_ratio": cut_later.head_ratio, "params": cut_later.params,
                                 "drift": drifts.get(round(cut_later.head_ratio, 6)),
                                 **{k: cut_later.metrics.get(k) for k, _ in REPORTED}},
                       "up_front": {"head_ratio": cut_up_front.head_ratio, "params": cut_up_front.params,
                                    "drift": drifts.get(round(cut_up_front.head_ratio, 6)),
                                    **{k: cut_up_front.metrics.get(k) for k, _ in REPORTED}}}
                rows.append(row)
                log(f"{model_name} seed {seed} params {keep}: later h={cut_later.head_ratio:.3f} "
                    + "/".join(pct(row['later'][k]) for k, _ in REPORTED) + f", up front h={cut_up_front.head_ratio:.3f} "
                    + "/".join(pct(row['up_front'][k]) for k, _ in REPORTED))
    return {"rows": rows, "split_costs": costs, "run_budgets": run_budgets, "later": later, "machine": machine_info()}


def markdown(report: dict[str, Any]) -> str:
    lines = ["# A budget cut later against the same budget asked for up front", "",
             f"The run asks for {', '.join(f'{k:.0%}' for k in report['run_budgets'])} of the parameters (with the "
             "default grid of splits); each later budget is cut from its scores (`extract`) and asked for up front. "
             "Accuracy in percent (own head / linear probe / k-NN), mean over seeds; drift: the fitness (1 - cosine) "
             "of the split on the up-front race's images, where the later split was one of its candidates.", "",
             "| model | kept params | head ratio later / up front | later | up front | later - up front |",
             "|---|---:|---|---|---|---|"]
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in report["rows"]:
        groups.setdefault((row["model"], row["keep"]), []).append(row)
    for (model, keep), rows in groups.items():
        def mean(side: str, key: str) -> Optional[float]:
            values = [r[side][key] for r in rows if r[side].get(key) is not None]
            return statistics.fmean(values) if values else None

        cells = {side: "/".join(pct(mean(side, k), 2) for k, _ in REPORTED) for side in ("later", "up_front")}
        diff = "/".join("n/a" if mean("later", k) is None else f"{100 * (mean('later', k) - mean('up_front', k)):+.2f}"
                        for k, _ in REPORTED)
        ratios = ", ".join(f"{r['later']['head_ratio']:.2f}/{r['up_front']['head_ratio']:.2f}" for r in rows)
        lines.append(f"| {model} | {keep:.0%} | {ratios} | {cells['later']} | {cells['up_front']} | {diff} |")
    lines += ["", "Split time of the run: its asked budgets alone against the same with the grid (seconds).", "",
              "| model | seed | asked alone | with the grid | ratio |", "|---|---:|---:|---:|---:|"]
    for c in report["split_costs"]:
        lines.append(f"| {c['model']} | {c['seed']} | {c['asked_alone_s']:.1f} | {c['with_grid_s']:.1f} | "
                     f"{c['with_grid_s'] / max(c['asked_alone_s'], 1e-9):.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="clutter,ssl_clutter", help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--run-budgets", default="0.51,0.41", help="the run's kept parameter fractions")
    parser.add_argument("--later", default="0.32,0.23", help="kept parameter fractions cut later")
    parser.add_argument("--val-samples", type=int, default=5000)
    parser.add_argument("--train-samples", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke run: one model, one seed, 200 / 300 images")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/later_budgets)")
    args = parse_args(parser, argv)
    torch.set_num_threads(args.threads)
    models = args.models.split(",")[:1] if args.quick else args.models.split(",")
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    val, train = (200, 300) if args.quick else (args.val_samples, args.train_samples)
    report = run(models, seeds, [float(k) for k in args.run_budgets.split(",")],
                 [float(k) for k in args.later.split(",")], val, train, Progress())
    out = Path(args.out) if args.out else RESULTS / "later_budgets"
    write_results(out, report, markdown, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
