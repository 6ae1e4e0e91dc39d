"""The head/MLP split choice against trying every candidate on every image: the same splits? how much faster? what
does the default grid add?

    python benchmarks/split_choice.py                 # the five development models, seeds 0 1 2 (1 thread)
    python benchmarks/split_choice.py --tiny          # smoke run (CI): the reference model, a few images

For each development model and seed (the pruning subset, the probes), with the settings of ``configs/prune/demo.yaml``
(read by ``prune.py``'s own parser) and the default score: the importance pass once, then, side by side in one run,

- the exhaustive reference (:func:`snapvit_pl.pipeline.splits.exhaustive_splits`: every candidate of every window on
  every fitness image, what the split choice did before issue 30), for the budgets asked for alone and with the
  default grid;
- :func:`snapvit_pl.pipeline.choose_splits` (raced candidates, shared evaluations, grid points raced near the split
  of the nearest budget asked for and moving on while a neighbour wins, the confirmed first-order choice, the grid's
  indifference zone and last round), for the budgets asked for alone and
  with the default grid, each run ``--repeats`` times in alternation; and once, untimed, with the grid's near ties
  settled to the last image (``grid_indifference=0``, ``grid_images`` every image), for the fitness images the zone
  and the last round save.

Times are the CPU time of the one-thread process (on a shared machine the wall clock, also recorded, swings 2-3x
between identical runs); the median of the repeats is reported, the minimum kept in the JSON.

Each timed run builds its own fitness (dense embeddings and PCA), as the split stage of a run without a search does.
Every chosen split is compared with the exhaustive one: the same head ratio (or the same sub-network), else the
relative difference of their drifts on all the fitness images; a grid point's split is also checked to be a local
minimum of its window (drifting at most 1% more than each nearest distinct neighbour on all the fitness images). The first-order estimate (half the removed units'
sensitivity) is compared with the exhaustive choice at every point, by the size of the estimate.
Writes ``benchmarks/results/split_choice.json`` and ``.md`` (``--tiny``: ``split_choice_tiny``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    MODELS, RESULTS, Progress, machine_info, model_overrides, parse_args, prune_setup, write_results,
)
from snapvit_pl.elastic import CostModel, ElasticScores  # noqa: E402
from snapvit_pl.models import fingerprint  # noqa: E402
from snapvit_pl.pipeline import choose_splits, local_importance  # noqa: E402
from snapvit_pl.pipeline.splits import FIRST_ORDER_DRIFT, GRID_IMAGES, GRID_INDIFFERENCE, exhaustive_splits  # noqa: E402
from snapvit_pl.scoring import OutputSensitivity  # noqa: E402
from snapvit_pl.search.fitness import EmbeddingFitness  # noqa: E402

TINY = ["--search.num_images=48", "--search.batch_size=48", "--search.pca_components=16", "--data.init_args.max_samples=32"]


def run_seed(model_name: str, seed: int, args: argparse.Namespace, log: Progress) -> dict[str, Any]:
    setup = prune_setup(*model_overrides(model_name), f"--data.init_args.seed={seed}", f"--search.seed={seed}",
                        *(TINY if args.tiny else []))
    model, dm, export, search = setup.model, setup.datamodule, setup.export, setup.search
    scorer = OutputSensitivity(probes=setup.importance.scorer.probes, seed=seed)  # as compare_methods seeds it
    dm.train_views = "plain"
    started = time.perf_counter()
    local = local_importance(scorer, model, dm.train_dataloader())
    importance_s = time.perf_counter() - started
    scores = ElasticScores(local.heads, local.neurons, None, setup.spec.to_dict(), fingerprint(model),
                           setup.importance.min_mlp_keep, setup.importance.min_head_keep,
                           settings={"scorer": {"name": scorer.name, **scorer.config()}})
    images = dm.unlabeled_images(search.num_images, search.batch_size)
    cost = CostModel(model)
    budgets = export.budgets
    asked_only, with_grid = replace(export, split_grid=0.0), export

    def fitness() -> EmbeddingFitness:
        return EmbeddingFitness(model, images, scores, search, pairs=[(0.0, 0.0)])

    def timed(function):
        """The result, and the seconds of CPU time this (one-thread) process spent: unlike the wall clock, not
        stretched by the other jobs of a shared machine (the wall clock is recorded too)."""
        wall, cpu = time.perf_counter(), time.process_time()
        result = function()
        return result, time.process_time() - cpu, time.perf_counter() - wall

    reference, old_grid_s, old_grid_wall = timed(lambda: exhaustive_splits(fitness(), scores, budgets, with_grid, cost))
    _, old_asked_s, old_asked_wall = timed(lambda: exhaustive_splits(fitness(), scores, budgets, asked_only, cost))
    log(f"{model_name} seed {seed}: exhaustive {old_asked_s:.1f} s asked, {old_grid_s:.1f} s with the grid (CPU)")
    times: dict[str, list[float]] = {"asked": [], "grid": []}
    walls: dict[str, list[float]] = {"asked": [], "grid": []}
    choices = []
    for _ in range(args.repeats):
        for kind, settings in (("asked", asked_only), ("grid", with_grid)):
            made, seconds, wall = timed(lambda: choose_splits(model, images, scores, budgets, search, settings, cost,
                                                              fitness=fitness()))
            times[kind].append(seconds)
            walls[kind].append(wall)
            if kind == "grid":
                choices = made
    settled = choose_splits(model, images, scores, budgets, search, with_grid, cost, fitness=fitness(),
                            grid_indifference=0.0, grid_images=len(images))
    rows = []
    for choice in choices:
        best_h, best_drift, drifts = reference[choice.label]
        drift = next(d for h, (d, _, _) in drifts.items() if abs(h - choice.head_ratio) <= 1e-9)
        estimates = {h: e for h, (_, e, _) in drifts.items()}
        flops = {round(h, 9): f for h, (_, _, f) in drifts.items()}
        # the window's distinct sub-networks in head-ratio order (one drift each): is the choice a local minimum?
        distinct = sorted({d: h for h, (d, _, _) in sorted(drifts.items(), reverse=True)}.items(), key=lambda x: x[1])
        here = next(i for i, (d, _) in enumerate(distinct) if d == drift)
        local = all(drift <= 1.01 * distinct[i][0] for i in (here - 1, here + 1) if 0 <= i < len(distinct))
        first_order_h = min(estimates, key=lambda h: (estimates[h], abs(h - choice.schedule_head_ratio)))
        rows.append({
            "label": choice.label, "requested": choice.requested, "criterion": choice.criterion,
            "head_ratio": choice.head_ratio, "exhaustive_head_ratio": best_h, "drift": drift,
            "exhaustive_drift": best_drift, "same": abs(best_h - choice.head_ratio) <= 1e-9 or drift == best_drift,
            "local_minimum": local,
            "relative_drift_difference": drift / best_drift - 1 if best_drift > 0 else 0.0,
            "images": choice.images, "candidates": len(drifts), "first_order_estimate": estimates[first_order_h],
            "raced_flops": [flops[round(h, 9)] for h, _, _ in choice.candidates],  # kept FLOPs fraction of each raced
            "exhaustive_flops": sum(flops.values()),
            "first_order_head_ratio": first_order_h,
            "first_order_same": abs(first_order_h - best_h) <= 1e-9 or drifts[first_order_h][0] == best_drift,
        })
    summary = {k: {"min_s": min(v), "median_s": statistics.median(v), "runs_s": v, "wall_runs_s": walls[k]}
               for k, v in times.items()}
    # fitness images the races evaluated (all candidates together): the budgets asked for, the grid, the grid's on
    # splits raced to their last round (GRID_IMAGES), and the grid's with every near tie settled (no indifference
    # zone, every image)
    last_round = min(GRID_IMAGES, len(images))
    counted = {"asked": sum(sum(c.images) for c in choices if c.requested),
               "grid": sum(sum(c.images) for c in choices if not c.requested),
               "grid_to_the_end": sum(n for c in choices if not c.requested for n in c.images if n >= last_round),
               "grid_settled": sum(sum(c.images) for c in settled if not c.requested)}
    # the same work in forward FLOPs (each candidate's images x its kept FLOPs fraction; the dense forward of the
    # fitness images, which both runs make, counted once): the cost where the forwards are compute-bound (ViT-B-sized)
    forwards = {kind: sum(n * f for r in rows if r["requested"] == (kind == "asked")
                          for n, f in zip(r["images"], r["raced_flops"])) for kind in ("asked", "grid")}
    entry = {
        "seed": seed, "importance_s": importance_s, "fitness_images": int(images.shape[0]), "images": counted,
        "grid_images_over_asked": counted["grid"] / max(1, counted["asked"]),
        "grid_settled_images_over_asked": counted["grid_settled"] / max(1, counted["asked"]),
        "settled_same": sum(a.head_ratio == b.head_ratio for a, b in zip(choices, settled)),
        "exhaustive": {"asked_s": old_asked_s, "grid_s": old_grid_s, "asked_wall_s": old_asked_wall,
                       "grid_wall_s": old_grid_wall},
        "raced": summary,
        "grid_over_asked": {"min": summary["grid"]["min_s"] / summary["asked"]["min_s"],
                            "median": summary["grid"]["median_s"] / summary["asked"]["median_s"]},
        "grid_over_asked_flops": (len(images) + forwards["asked"] + forwards["grid"]) / (len(images) + forwards["asked"]),
        "speedup": {"asked": old_asked_s / summary["asked"]["median_s"], "grid": old_grid_s / summary["grid"]["median_s"]},
        "points": rows,
    }
    log(f"  raced: {summary['asked']['median_s']:.1f} s asked, {summary['grid']['median_s']:.1f} s with the grid "
        f"(grid/asked {entry['grid_over_asked']['median']:.2f}); same as exhaustive "
        f"{sum(r['same'] for r in rows)}/{len(rows)}, worst drift +{100 * max(r['relative_drift_difference'] for r in rows):.2f}%")
    return entry


def markdown(report: dict[str, Any]) -> str:
    s, m = report["settings"], report["machine"]
    lines = ["# Split choice: raced against exhaustive", "",
             f"`python benchmarks/split_choice.py{' --tiny' if report['tiny'] else ''}` on {m['cpu']} "
             f"({m['cpu_count']} cores), {m['date']}, {m['torch_threads']} torch thread, load average "
             f"{m['load_average_1m_at_end']} at the end (other jobs shared the machine: times are the CPU time of the "
             "one-thread process, which the other jobs stretch far less than the wall clock (both in the JSON); compare "
             "the ratios, measured side by side). Settings of `configs/prune/demo.yaml`, the default score; the budgets asked for are the "
             f"defaults ({s['budgets']}), the grid every {s['split_grid']:.0%} of the dense cost from one half down and every "
             f"{2 * s['split_grid']:.0%} above; {s['repeats']} alternating runs of each "
             "raced configuration (median; the minimum in the JSON).", "",
             "| model | seed | points | same split as exhaustive | worst drift difference | exhaustive: asked / +grid (s) "
             "| raced: asked / +grid (s) | grid adds (CPU time) | grid adds (forward FLOPs) "
             "| grid images / asked (near ties settled) | speedup asked / +grid |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, entries in report["models"].items():
        for e in entries:
            rows = e["points"]
            r = e["raced"]
            lines.append(
                f"| {name} | {e['seed']} | {len(rows)} | {sum(x['same'] for x in rows)}/{len(rows)} | "
                f"+{100 * max(x['relative_drift_difference'] for x in rows):.2f}% | "
                f"{e['exhaustive']['asked_s']:.1f} / {e['exhaustive']['grid_s']:.1f} | "
                f"{r['asked']['median_s']:.1f} / {r['grid']['median_s']:.1f} | "
                f"{100 * (e['grid_over_asked']['median'] - 1):+.0f}% | {100 * (e['grid_over_asked_flops'] - 1):+.0f}% | "
                f"{100 * e['grid_images_over_asked']:.0f}% "
                f"({100 * e['grid_settled_images_over_asked']:.0f}%) | "
                f"{e['speedup']['asked']:.1f}x / {e['speedup']['grid']:.1f}x |")
    g = report["summary"]
    lines += ["", f"- Over every model and seed: {g['same']}/{g['points']} chosen splits are the exhaustive one "
              f"({g['asked_same']}/{g['asked_points']} budgets asked for, worst drift difference "
              f"+{100 * g['asked_worst_difference']:.2f}%, the bar: within 1%; {g['grid_same']}/{g['grid_points']} grid "
              f"points, worst +{100 * g['grid_worst_difference']:.2f}%, and {g['grid_local']}/{g['grid_points']} a local "
              "minimum of their window to 1%: a grid point races only near the nearest asked budget's split). The grid adds at most "
              f"{100 * (g['max_grid_over_asked'] - 1):.0f}% (median runs; {100 * (g['max_grid_over_asked_min'] - 1):.0f}% "
              "by the fastest runs) to the split stage over the budgets asked for alone (the bar: 50%). In forward "
              f"FLOPs (the cost where the forwards are compute-bound, as on ViT-B-sized models; these small models' "
              f"forwards of 16-128 images also pay a fixed cost per call) it adds "
              f"{100 * (g['grid_over_asked_flops']['min'] - 1):.0f}-{100 * (g['grid_over_asked_flops']['max'] - 1):.0f}%.",
              f"- A grid point's race ends once its leader is within {GRID_INDIFFERENCE:.0%} of the others' drift (its "
              f"indifference zone), or at {GRID_IMAGES} images, the least drift on them winning (the budgets "
              "asked for settle every near tie): its races evaluate "
              f"{100 * g['grid_images_over_asked']['min']:.0f}-{100 * g['grid_images_over_asked']['max']:.0f}% as many "
              "fitness images as the budgets asked for (column *grid images / asked*), against "
              f"{100 * g['grid_settled_images_over_asked']['min']:.0f}-"
              f"{100 * g['grid_settled_images_over_asked']['max']:.0f}% with every near tie settled to the last image "
              f"(in brackets; the same head ratio at {g['settled_same']}/{g['points']} points); "
              f"{100 * g['grid_images_to_the_end']:.0f}% of the grid's images go to splits raced to that last round.",
              f"- Fitness images evaluated, all candidates together: {g['raced_image_fraction']:.1%} of what the "
              f"exhaustive choice evaluates ({g['raced_flops_fraction']:.1%} of its forward FLOPs; with 1000 fitness "
              f"images, as `configs/prune/dino_vitb16.yaml`, at most {g['raced_flops_fraction_at_1000_images']:.1%}, "
              "counting every candidate raced to the last image here as raced to all 1000).",
              f"- The first-order estimate (half the removed units' sensitivity) picks the exhaustive split at "
              f"{g['first_order_below']['same']}/{g['first_order_below']['points']} points where its estimate is below "
              f"{FIRST_ORDER_DRIFT} and at {g['first_order_above']['same']}/{g['first_order_above']['points']} above: "
              "the grid takes it below that (once it leads a first round of 16 images), never for a budget asked for.",
              ""]
    return "\n".join(lines) + "\n"


def spread(values: Iterable[float]) -> dict[str, float]:
    """``{"min": ..., "max": ...}`` of the runs' values (what the docs quote as a range)."""
    values = list(values)
    return {"min": min(values), "max": max(values)}


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    entries = [e for es in report["models"].values() for e in es]
    rows = [r for e in entries for r in e["points"]]
    below = [r for r in rows if r["first_order_estimate"] < FIRST_ORDER_DRIFT]
    above = [r for r in rows if r["first_order_estimate"] >= FIRST_ORDER_DRIFT]
    raced = sum(sum(r["images"]) for r in rows)
    exhaustive = sum(r["candidates"] * e["fitness_images"] for e in entries for r in e["points"])

    def flops_fraction(images: int) -> float:
        """FLOPs of the raced forwards over the exhaustive ones with ``images`` fitness images, a candidate raced to
        every image of the benchmark's set taken to every one of ``images`` (an upper bound for a larger set)."""
        done = sum((images if n == e["fitness_images"] else n) * f for e in entries for r in e["points"]
                   for n, f in zip(r["images"], r["raced_flops"]))
        return done / sum(images * r["exhaustive_flops"] for e in entries for r in e["points"])

    asked = [r for r in rows if r["requested"]]
    grid = [r for r in rows if not r["requested"]]
    return {"points": len(rows), "same": sum(r["same"] for r in rows),
            "asked_points": len(asked), "asked_same": sum(r["same"] for r in asked),
            "asked_worst_difference": max((r["relative_drift_difference"] for r in asked), default=0.0),
            "grid_points": len(grid), "grid_same": sum(r["same"] for r in grid),
            "grid_local": sum(r["local_minimum"] for r in grid),
            "grid_worst_difference": max((r["relative_drift_difference"] for r in grid), default=0.0),
            "worst_difference": max(r["relative_drift_difference"] for r in rows),
            "max_grid_over_asked": max(e["grid_over_asked"]["median"] for e in entries),
            "grid_over_asked_median": spread(e["grid_over_asked"]["median"] for e in entries),
            "speedup_asked": spread(e["speedup"]["asked"] for e in entries),
            "speedup_grid": spread(e["speedup"]["grid"] for e in entries),
            "max_grid_over_asked_min": max(e["grid_over_asked"]["min"] for e in entries),
            "grid_images_over_asked": spread(e["grid_images_over_asked"] for e in entries),
            "grid_settled_images_over_asked": spread(e["grid_settled_images_over_asked"] for e in entries),
            "grid_over_asked_flops": spread(e["grid_over_asked_flops"] for e in entries),
            "settled_same": sum(e["settled_same"] for e in entries),
            "grid_images_to_the_end": sum(e["images"]["grid_to_the_end"] for e in entries)
            / max(1, sum(e["images"]["grid"] for e in entries)),
            "raced_image_fraction": raced / exhaustive,
            "raced_flops_fraction": flops_fraction(entries[0]["fitness_images"]),
            "raced_flops_fraction_at_1000_images": flops_fraction(1000),
            "first_order_below": {"points": len(below), "same": sum(r["first_order_same"] for r in below)},
            "first_order_above": {"points": len(above), "same": sum(r["first_order_same"] for r in above)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="smoke run: the reference model, seed 0, few images")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each raced configuration")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/split_choice[_tiny])")
    args = parse_args(parser, argv)
    torch.set_num_threads(1)
    if args.tiny:
        args.models, args.seeds, args.repeats = "reference", "0", 1
    log = Progress()
    log("1 torch thread")
    report: dict[str, Any] = {"benchmark": "benchmarks/split_choice.py", "tiny": args.tiny, "models": {}}
    for name in args.models.split(","):
        report["models"][name] = [run_seed(name, int(seed), args, log) for seed in args.seeds.split(",")]
    setup_export = prune_setup(*model_overrides("reference")).export
    report["settings"] = {"budgets": [b.label() for b in setup_export.budgets], "split_grid": setup_export.split_grid,
                          "split_images": setup_export.split_images, "repeats": args.repeats,
                          "seeds": [int(s) for s in args.seeds.split(",")]}
    report["summary"] = summarise(report)
    report["machine"] = machine_info()
    report["total_s"] = time.perf_counter() - log.start
    prefix = Path(args.out) if args.out else RESULTS / ("split_choice_tiny" if args.tiny else "split_choice")
    write_results(prefix, report, markdown, args)
    log(f"wrote {prefix}.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
