"""The coefficient search's progress against wall time: the paper's xNES settings against this project's SNES.

    python benchmarks/search_convergence.py --threads 1              # both development models, 3 seeds (~40 min)
    python benchmarks/search_convergence.py --quick                  # smoke run

For each development model: SnapViT's SSL-Fisher local scores (the scores the search is for) and the fitness images of
``configs/prune/demo.yaml`` (256 images), then ``--evaluations`` fitness evaluations of each search
(``SearchSettings.paper()`` and ``SearchSettings.snes()``, same fitness, same seeds), with the best fitness
recorded after every generation against evaluations and wall time. Then the rank correlation
(Spearman) of cheaper fitness sets (fewer images) with the fitness on 1000 images, over candidates
drawn around the initial coefficients at the spreads a search visits (what "a cheaper fitness keeps
the ranking" rests on). Writes ``benchmarks/results/search_convergence.{json,md,png}``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    MODELS, RESULTS, Progress, machine_info, model_overrides, parse_args, prune_setup, write_results,
)
from benchmarks.compare_methods import method_scores  # noqa: E402
from snapvit_pl.elastic import initial_coefficients  # noqa: E402
from snapvit_pl.pipeline import SearchSettings, run_search  # noqa: E402
from snapvit_pl.search.fitness import EmbeddingFitness  # noqa: E402


def curve(setup, scores, images, settings: SearchSettings) -> list[tuple[int, float, float]]:
    """(evaluations, seconds, best fitness so far) after every generation, from the start."""
    points: list[tuple[int, float, float]] = []
    started = time.perf_counter()
    initial: list[float] = []

    def record(es, candidates, values) -> None:
        best = min(es.best_fitness, initial[0]) if initial else es.best_fitness
        points.append((es.evaluations, time.perf_counter() - started, best))

    result = run_search(setup.model, images, scores, settings, on_generation=record)
    initial.append(result.initial_fitness)
    return [(0, 0.0, result.initial_fitness)] + [(e, t, min(f, result.initial_fitness)) for e, t, f in points]


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = (torch.tensor(x).argsort().argsort().double() for x in (a, b))
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def rank_correlation(setup, scores, sizes: list[int], reference: int, per_spread: int) -> list[dict[str, Any]]:
    images = setup.datamodule.unlabeled_images(reference, setup.search.batch_size)
    mean = initial_coefficients(len(scores.head_scores), scores.heads_per_block, *SearchSettings.snes().initial_range)
    g = torch.Generator().manual_seed(0)
    candidates = [mean * torch.exp(sigma * torch.randn(mean.shape, generator=g))
                  for sigma in (0.1, 0.3, 0.5, 1.0) for _ in range(per_spread)]
    full = EmbeddingFitness(setup.model, images, scores, setup.search)
    truth = [full(c) for c in candidates]
    rows = []
    for n in sizes:
        cheap = EmbeddingFitness(setup.model, images[:n], scores, replace(setup.search, pca_components=min(n, setup.search.pca_components)))
        started = time.perf_counter()
        values = [cheap(c) for c in candidates]
        rows.append({"images": n, "spearman": spearman(values, truth), "seconds_per_evaluation": (time.perf_counter() - started) / len(candidates),
                     "spearman_within_spread": [spearman(values[i:i + per_spread], truth[i:i + per_spread])
                                                for i in range(0, len(candidates), per_spread)]})
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    log = Progress()
    torch.set_num_threads(args.threads)
    report: dict[str, Any] = {"benchmark": "benchmarks/search_convergence.py", "quick": args.quick, "models": {}}
    for model_name in args.models:
        setup = prune_setup(*model_overrides(model_name), *args.overrides)
        scores, _ = method_scores("ssl_fisher", setup, log, {})
        images = setup.datamodule.unlabeled_images(setup.search.num_images, setup.search.batch_size)
        searches = {
            "paper (xNES)": SearchSettings.paper(max_evaluations=args.evaluations, num_images=setup.search.num_images,
                                                 batch_size=setup.search.batch_size,
                                                 pca_components=setup.search.pca_components),
            "this project's (SNES)": SearchSettings.snes(max_evaluations=args.evaluations,
                                                         num_images=setup.search.num_images,
                                                         batch_size=setup.search.batch_size,
                                                         pca_components=setup.search.pca_components),
        }
        entry: dict[str, Any] = {"dimension": sum(scores.heads_per_block) + len(scores.heads_per_block), "curves": {}}
        for seed in args.seeds:  # alternating the searches: a load change on the machine hits both alike
            for label, settings in searches.items():
                points = curve(setup, scores, images, replace(settings, seed=seed))
                entry["curves"].setdefault(label, []).append(points)
                log(f"{model_name} {label} seed {seed}: fitness {points[0][2]:.4f} -> {points[-1][2]:.4f} "
                    f"in {points[-1][1]:.0f}s")
        entry["summary"] = summarise(entry["curves"], args.evaluations)
        entry["rank_correlation"] = rank_correlation(setup, scores, args.sizes, args.reference_images, args.per_spread)
        for row in entry["rank_correlation"]:
            log(f"{model_name}: {row['images']} images rank like {args.reference_images}: Spearman {row['spearman']:.3f}")
        report["models"][model_name] = entry
    report["settings"] = {k: v for k, v in vars(args).items() if k != "out"}
    report["machine"] = machine_info()
    report["total_s"] = time.perf_counter() - log.start
    return report


def _at(points: list, evaluations: int) -> float:
    return min(f for e, _, f in points if e <= evaluations)


def summarise(curves: dict[str, list], evaluations: int) -> dict[str, Any]:
    marks = sorted({m for m in (25, 50, 100, 150, 200, 300, 500) if m < evaluations} | {evaluations})
    out = {}
    for label, runs in curves.items():
        out[label] = {str(m): {"mean": statistics.fmean(_at(r, m) for r in runs),
                               "std": statistics.stdev([_at(r, m) for r in runs]) if len(runs) > 1 else 0.0}
                      for m in marks}
        out[label]["seconds"] = statistics.fmean(r[-1][1] for r in runs)
    return out


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = ["# Search convergence: the paper's xNES against this project's SNES", "",
             f"`python benchmarks/search_convergence.py`, {report['machine']['date']}, {report['machine']['torch_threads']} "
             f"torch thread(s), {report['total_s'] / 60:.0f} min; seeds {s['seeds']}, {s['evaluations']} evaluations each, "
             "the fitness of configs/prune/demo.yaml. Best fitness so far (embedding drift, lower is better), "
             "mean ± std over the seeds; plot: `search_convergence.png` (against wall time).", ""]
    for name, entry in report["models"].items():
        marks = [k for k in next(iter(entry["summary"].values())) if k != "seconds"]
        lines += [f"## {name} (D = {entry['dimension']} coefficients)", "",
                  "| search | " + " | ".join(f"after {m}" for m in marks) + " | seconds |",
                  "|---|" + "---:|" * (len(marks) + 1)]
        for label, summary in entry["summary"].items():
            lines.append(f"| {label} | " + " | ".join(f"{summary[m]['mean']:.4f} ± {summary[m]['std']:.4f}" for m in marks)
                         + f" | {summary['seconds']:.0f} |")
        lines += ["", f"Rank correlation with the fitness on {s['reference_images']} images "
                  f"({4 * s['per_spread']} candidates at spreads 0.1-1.0 around the initial coefficients):", "",
                  "| images | Spearman | within one spread (0.1 / 0.3 / 0.5 / 1.0) | s per evaluation |",
                  "|---:|---:|---|---:|"]
        lines += [f"| {r['images']} | {r['spearman']:.3f} | " + " / ".join(f"{v:.2f}" for v in r["spearman_within_spread"])
                  + f" | {r['seconds_per_evaluation']:.2f} |" for r in entry["rank_correlation"]]
        lines.append("")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.5), squeeze=False)
    for ax, (name, entry) in zip(axes[0], models.items()):
        for color, (label, runs) in zip(("tab:gray", "tab:blue"), entry["curves"].items()):
            for i, points in enumerate(runs):
                ax.step([t for _, t, _ in points], [f for _, _, f in points], where="post", color=color, alpha=0.8,
                        label=label if i == 0 else None)
        ax.set(title=f"{name}: D = {entry['dimension']}", xlabel="wall time (s, 1 CPU thread)",
               ylabel="best fitness so far (lower is better)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("coefficient search: the paper's xNES against this project's SNES\n(one line per seed)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--evaluations", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/search_convergence[_quick])")
    args = parse_args(parser, argv)
    args.models, args.seeds = args.models.split(","), [int(s) for s in args.seeds.split(",")]
    args.sizes, args.reference_images, args.per_spread, args.overrides = [64, 128, 256, 500], 1000, 12, []
    if args.quick:
        args.models, args.seeds, args.evaluations = ["reference"], [0], 16
        args.sizes, args.reference_images, args.per_spread = [16], 32, 3
        args.overrides = ["--data.init_args.max_samples=64", "--search.num_images=32"]
    report = run(args)
    prefix = Path(args.out) if args.out else RESULTS / ("search_convergence_quick" if args.quick else "search_convergence")
    write_results(prefix, report, markdown, args)
    plot(report, prefix.with_suffix(".png"))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
