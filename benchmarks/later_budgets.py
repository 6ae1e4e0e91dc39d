"""A budget cut later from a run's elastic scores against the same budget asked for up front (issue 55, point 5).

    python benchmarks/later_budgets.py --models clutter,ssl_clutter --seeds 0,1,2   # benchmarks/results/later_budgets.*
    python benchmarks/later_budgets.py --quick                                       # smoke run

For each development model and seed: the default scores (``ours``, as ``compare_methods.py`` computes them) of a run
whose budgets stop at ``--run-budgets`` (kept parameter fractions, with the configuration's grid of splits,
``export.split_grid``, or ``--split-grid``) are cut at each ``--later`` fraction (what ``snapvit-pl extract`` does
without the run's data: the head ratio recorded for that fraction, or interpolated between the two nearest grid
points), and the same fraction is asked for up front (``choose_splits`` with that budget: its whole window raced, no
grid). Both models are evaluated as ``compare_methods.py`` evaluates (own head, linear probe, k-NN on
``--val-samples`` held-out images); the table shows each pair's kept heads, the fitness drift of each choice (on all
the run's fitness images) and the accuracy difference. The split time of the run with its grid is reported against
the run's asked budgets alone (the grid's cost).
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
from snapvit_pl.search.fitness import EmbeddingFitness  # noqa: E402


def run(models: list[str], seeds: list[int], run_budgets: list[float], later: list[float], val_samples: int,
        train_samples: int, log: Progress, split_grid: Optional[float] = None) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    costs: list[dict[str, Any]] = []
    for model_name in models:
        evaluation = None
        for seed in seeds:
            grid = [] if split_grid is None else [f"--export.split_grid={split_grid}"]
            setup = prune_setup(*model_overrides(model_name), f"--data.init_args.seed={seed}", f"--search.seed={seed}",
                                *grid)
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
            clock, cpu = time.perf_counter(), time.process_time()
            alone = choose_splits(setup.model, images, scores, asked, setup.search, replace(setup.export, split_grid=0),
                                  cost)
            alone_s, alone_cpu_s = time.perf_counter() - clock, time.process_time() - cpu
            clock, cpu = time.perf_counter(), time.process_time()
            run_choices = choose_splits(setup.model, images, scores, asked, setup.search, setup.export, cost)
            grid_s, grid_cpu_s = time.perf_counter() - clock, time.process_time() - cpu
            costs.append({"model": model_name, "seed": seed, "asked_alone_s": alone_s, "with_grid_s": grid_s,
                          "asked_alone_cpu_s": alone_cpu_s, "with_grid_cpu_s": grid_cpu_s,
                          "asked_alone_flops": raced_flops(alone, scores, cost),
                          "with_grid_flops": raced_flops(run_choices, scores, cost)})
            run_table = split_table(run_choices)
            fitness = EmbeddingFitness(setup.model, images, scores, setup.search, pairs=[(0.0, 0.0)])
            for keep in later:
                budget = Budget(params=keep)
                scores.splits = run_table
                (cut_later,) = extract_models(setup.model, scores, [budget], evaluation=evaluation, cost=cost)
                (choice,) = choose_splits(setup.model, images, scores, [budget], setup.search,
                                          replace(setup.export, split_grid=0), cost)
                scores.splits = split_table([choice])
                (cut_up_front,) = extract_models(setup.model, scores, [budget], evaluation=evaluation, cost=cost)
                row = {"model": model_name, "seed": seed, "keep": keep,
                       **{side: {"head_ratio": cut.head_ratio, "heads": sum(cut.subnet.head_counts),
                                 "params": cut.params, "drift": fitness.distance(cut.subnet),
                                 **{k: cut.metrics.get(k) for k, _ in REPORTED}}
                          for side, cut in (("later", cut_later), ("up_front", cut_up_front))}}
                rows.append(row)
                log(f"{model_name} seed {seed} params {keep}: " + ", ".join(
                    f"{side} h={row[side]['head_ratio']:.3f} drift {row[side]['drift']:.4f} "
                    + "/".join(pct(row[side][k]) for k, _ in REPORTED) for side in ("later", "up_front")))
    groups = summary(rows)
    worst = min((g for g in groups if g["worst_points"] is not None), key=lambda g: g["worst_points"])
    worst = {"model": worst["model"], "keep": worst["keep"], "points": worst["worst_points"],
             "metric": min((k for k, d in worst["points"].items() if d is not None), key=worst["points"].get)}
    ratios = {"forwards": [c["with_grid_flops"] / c["asked_alone_flops"] for c in costs],
              "cpu": [c["with_grid_cpu_s"] / c["asked_alone_cpu_s"] for c in costs],
              "wall": [c["with_grid_s"] / c["asked_alone_s"] for c in costs]}
    grid_cost = {k: {"min": min(v), "max": max(v)} for k, v in ratios.items()}  # the grid's cost: with / asked alone
    return {"rows": rows, "groups": groups, "worst": worst, "split_costs": costs, "grid_cost": grid_cost,
            "run_budgets": run_budgets,
            "later": later, "split_grid": setup.export.split_grid, "machine": machine_info()}


def raced_flops(choices: list, scores: Any, cost: CostModel) -> float:
    """The forwards the splits' races made, in dense forwards: each raced candidate's fitness images times its kept
    FLOPs fraction (a sub-network two points share counted at each; the cost where forwards are compute-bound, as on
    ViT-B-sized models, while these small models' forwards of 16-128 images also pay a fixed cost per call)."""
    return sum(n * cost.flops(scores.subnet(Budget(mlp_ratio=m, head_ratio=h), cost)[0]) / cost.dense_flops
               for choice in choices for (h, m, _), n in zip(choice.candidates, choice.images))


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and later budget: the means over seeds of each side's drift and accuracies, and ``later - up
    front`` in accuracy points (None where a model has no such metric)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["keep"]), []).append(row)
    found = []
    for (model, keep), members in groups.items():
        def mean(side: str, key: str) -> Optional[float]:
            values = [r[side][key] for r in members if r[side].get(key) is not None]
            return statistics.fmean(values) if values else None

        sides = {side: {key: mean(side, key) for key in ("drift", *(k for k, _ in REPORTED))}
                 for side in ("later", "up_front")}
        diff = {k: None if sides["later"][k] is None else 100 * (sides["later"][k] - sides["up_front"][k])
                for k, _ in REPORTED}
        found.append({"model": model, "keep": keep, **sides, "points": diff,
                      "worst_points": min((d for d in diff.values() if d is not None), default=None)})
    return found


def markdown(report: dict[str, Any]) -> str:
    lines = ["# A budget cut later against the same budget asked for up front", "",
             f"The run asks for {', '.join(f'{k:.0%}' for k in report['run_budgets'])} of the parameters (with a grid "
             f"of splits every {report['split_grid']:g} of the dense cost from one half down and every "
             f"{2 * report['split_grid']:g} above, `export.split_grid`); each later budget is "
             "cut from its scores (`extract` without the run's data: the head ratio interpolated between the run's "
             "recorded splits) and asked for up front (its window of candidate splits raced). Accuracy in percent "
             "(own head / linear probe / k-NN), mean over seeds; heads: "
             "the heads each split keeps, per seed; drift: the fitness (1 - cosine to the dense embeddings) of each "
             "split on all the run's fitness images, mean over seeds.", "",
             "| model | kept params | heads kept later / up front | drift later / up front | later | up front "
             "| later - up front |", "|---|---:|---|---|---|---|---|"]
    for group in report["groups"]:
        rows = [r for r in report["rows"] if (r["model"], r["keep"]) == (group["model"], group["keep"])]
        cells = {side: "/".join(pct(group[side][k], 2) for k, _ in REPORTED) for side in ("later", "up_front")}
        diff = "/".join("n/a" if group["points"][k] is None else f"{group['points'][k]:+.2f}" for k, _ in REPORTED)
        heads = ", ".join(f"{r['later']['heads']}/{r['up_front']['heads']}" for r in rows)
        lines.append(f"| {group['model']} | {group['keep']:.0%} | {heads} | {group['later']['drift']:.4f}/"
                     f"{group['up_front']['drift']:.4f} | {cells['later']} | {cells['up_front']} | {diff} |")
    same = sum(r["later"]["heads"] == r["up_front"]["heads"] for r in report["rows"])
    lower = sum(r["later"]["heads"] != r["up_front"]["heads"] and r["later"]["drift"] <= r["up_front"]["drift"]
                for r in report["rows"])
    total = len(report["rows"])
    lines += ["", f"Of {total} later cuts, {same} keep as many heads as the cut asked for up front; of the other "
              f"{total - same}, {lower} drift less than it on the fitness images (the up-front race only tries head "
              "ratios spaced by `export.split_step`, the interpolation lands between them)."]
    lines += ["", "Split cost of the run: its asked budgets alone against the same with the grid, in CPU seconds of "
              "the one-thread process (the wall clock, which other jobs on the machine stretch, in the JSON) and in "
              "the races' forwards (dense-forward equivalents: each raced candidate's images times its kept FLOPs "
              "fraction).", "",
              "| model | seed | asked alone (CPU s) | with the grid (CPU s) | ratio | asked alone (forwards) | with the "
              "grid (forwards) | ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in report["split_costs"]:
        lines.append(f"| {c['model']} | {c['seed']} | {c['asked_alone_cpu_s']:.1f} | {c['with_grid_cpu_s']:.1f} | "
                     f"{c['with_grid_cpu_s'] / max(c['asked_alone_cpu_s'], 1e-9):.2f}x | {c['asked_alone_flops']:.0f} | "
                     f"{c['with_grid_flops']:.0f} | {c['with_grid_flops'] / max(c['asked_alone_flops'], 1e-9):.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="clutter,ssl_clutter", help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--run-budgets", default="0.51,0.41", help="the run's kept parameter fractions")
    parser.add_argument("--later", default="0.32,0.23", help="kept parameter fractions cut later")
    parser.add_argument("--split-grid", type=float, default=None,
                        help="the run's export.split_grid (default: the configuration's)")
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
                 [float(k) for k in args.later.split(",")], val, train, Progress(), args.split_grid)
    out = Path(args.out) if args.out else RESULTS / "later_budgets"
    write_results(out, report, markdown, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
