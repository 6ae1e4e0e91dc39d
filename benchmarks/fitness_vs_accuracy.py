"""Does the fitness the coefficient search minimises predict accuracy? Across candidate coefficient vectors, the rank
correlation between the fitness and the pruned models' accuracy, with the fitness on the scoring images and on images
disjoint from them.

    OMP_NUM_THREADS=1 python benchmarks/fitness_vs_accuracy.py                 # every development model, seed 0
    python benchmarks/fitness_vs_accuracy.py --tiny                           # smoke run

For each development model and scorer (SnapViT's SSL-Fisher around the paper's initial coefficients 1.2 .. 0.8, and
the default score around 1), ``--candidates`` coefficient vectors: the initial one and draws ``c * exp(0.5 z)``
(the step of this project's SNES). Each candidate gets the search's fitness (``configs/prune/demo.yaml``'s: 1 - cos of
the PCA'd embeddings, averaged over the sparsity pairs) on the fitness images (drawn from the pruning images, as
``prune.py`` does) and on as many images of the train split disjoint from them; and the top-1 of its models at the two
sparsest pairs (about 51% and 41% of the parameters, cut as given), averaged, on held-out train images (own head where
there is one, linear probe, k-NN). Reported: Spearman correlations (fitness low = accuracy high gives a negative
correlation with accuracy, reported negated so that 1 is a perfect predictor). Writes
``benchmarks/results/fitness_vs_accuracy.{md,json}``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    MODELS, RESULTS, Progress, machine_info, model_overrides, parse_args, prune_setup, write_results,
)
from benchmarks.compare_methods import CachedEvaluation, Settings, evaluation_data  # noqa: E402
from benchmarks.sensitivity_vs_ablation import spearman  # noqa: E402
from snapvit_pl.data.sampling import balanced_subset_indices, dataset_targets  # noqa: E402
from snapvit_pl.elastic import Budget, ElasticScores, initial_coefficients  # noqa: E402
from snapvit_pl.eval.suite import EvaluationSettings  # noqa: E402
from snapvit_pl.models import fingerprint  # noqa: E402
from snapvit_pl.pipeline import extract_models, local_importance, scoring_views  # noqa: E402
from snapvit_pl.scoring import build_scorer  # noqa: E402
from snapvit_pl.search.fitness import EmbeddingFitness  # noqa: E402

SCORERS = {"ssl_fisher": (1.2, 0.8), "sensitivity": (1.0, 1.0)}  # scorer -> the initial coefficients it starts from
PAIRS = [(0.55, 0.4), (0.65, 0.5)]  # about 51% and 41% of the parameters kept
METRICS = ("head_top1", "linear_top1", "knn_top1")
TINY = ["--data.init_args.max_samples=32", "--search.num_images=32", "--search.pca_components=8"]


def disjoint_images(setup, count: int) -> torch.Tensor:
    """Plain views of ``count`` train images outside the pruning subset (and so outside the fitness images)."""
    dm = setup.datamodule
    base = dm.base_dataset("train")
    pruning = dm.dataset("train")
    taken = set(getattr(pruning, "indices", range(len(pruning))))
    chosen = balanced_subset_indices(len(base), dataset_targets(base), count, seed=777, keep=lambda i: i not in taken)
    plain = dm.unlabeled_dataset("train", "plain", max_samples=len(base))
    return torch.stack([plain[i] for i in chosen])


def measure(model_name: str, candidates: int, sizes: dict[str, int], overrides: list[str], log: Progress) -> dict[str, Any]:
    setup = prune_setup(*model_overrides(model_name), *overrides)
    model, dm = setup.model, setup.datamodule
    has_head = bool(getattr(model, "num_classes", 0))
    metrics = [m for m in METRICS if has_head or m != "head_top1"]
    evaluation = CachedEvaluation(
        EvaluationSettings(metrics=["knn", "linear", *(["head"] if has_head else [])], **sizes),
        evaluation_data(setup, Settings(split="holdout", **sizes)), device=torch.device("cpu"))
    images = dm.unlabeled_images(setup.search.num_images, setup.search.batch_size)
    other = disjoint_images(setup, len(images))
    out: dict[str, Any] = {}
    for scorer_name, initial_range in SCORERS.items():
        started = time.perf_counter()
        scorer = build_scorer(scorer_name)
        dm.train_views = scoring_views(scorer)
        local = local_importance(scorer, model, dm.train_dataloader())
        scores = ElasticScores(local.heads, local.neurons, None, setup.spec.to_dict(), fingerprint(model),
                               setup.importance.min_mlp_keep, setup.importance.min_head_keep)
        start = initial_coefficients(len(local.heads), [len(h) for h in local.heads], *initial_range)
        generator = torch.Generator().manual_seed(0)
        draws = [start] + [start * torch.exp(0.5 * torch.randn(start.shape, generator=generator))
                           for _ in range(candidates - 1)]
        fitness_on = {name: EmbeddingFitness(model, imgs, scores, setup.search) for name, imgs in
                      (("scoring_images", images), ("disjoint_images", other))}
        rows = []
        for coefficients in draws:
            scores.coefficients = coefficients
            row = {name: fitness(coefficients) for name, fitness in fitness_on.items()}
            items = extract_models(model, scores, [Budget(mlp_ratio=m, head_ratio=h) for m, h in PAIRS],
                                   evaluation=evaluation)
            row.update({m: statistics.fmean(item.metrics[m] for item in items) for m in metrics})
            rows.append(row)
        fitness = {name: torch.tensor([r[name] for r in rows]) for name in fitness_on}
        result = {"candidates": len(rows), "seconds": time.perf_counter() - started, "rows": rows,
                  "fitness_agreement": spearman(fitness["scoring_images"], fitness["disjoint_images"])}
        for name, values in fitness.items():
            for metric in metrics:
                result[f"{name}/{metric}"] = -spearman(values, torch.tensor([r[metric] for r in rows]))
        out[scorer_name] = result
        log(f"{model_name} {scorer_name}: " + ", ".join(f"{k} {v:.2f}" for k, v in result.items()
                                                         if "/" in k or k == "fitness_agreement"))
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = ["# Does the search's fitness predict accuracy?", "",
             f"`python benchmarks/fitness_vs_accuracy.py{' --tiny' if report['tiny'] else ''}`, "
             f"{report['machine']['date']}, {report['machine']['cpu']} ({report['machine']['torch_threads']} torch "
             f"thread(s)). Per model and scorer, {report['candidates']} coefficient vectors (the initial one and "
             "log-normal steps of 0.5 around it); Spearman correlation between the fitness (lower is better) and the "
             "mean top-1 of the models at about 51% and 41% of the parameters on held-out train images, negated so "
             "that 1 means the fitness ranks candidates as their accuracy does; and between the fitness on the "
             "scoring images and on disjoint images.", "",
             "| model | scorer | fitness images | own head | linear probe | k-NN | fitness on disjoint images vs on "
             "scoring images |", "|---|---|---|---:|---:|---:|---:|"]
    for model_name, scorers in report["models"].items():
        for scorer_name, r in scorers.items():
            for name in ("scoring_images", "disjoint_images"):
                cells = [r.get(f"{name}/{m}") for m in METRICS]
                text = ["-" if c is None else f"{c:.2f}" for c in cells]
                agreement = f"{r['fitness_agreement']:.2f}" if name == "scoring_images" else ""
                lines.append(f"| {model_name} | {scorer_name} | {name.replace('_', ' ')} | " + " | ".join(text)
                             + f" | {agreement} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"subset of {','.join(MODELS)}")
    parser.add_argument("--candidates", type=int, default=16, help="coefficient vectors per model and scorer")
    parser.add_argument("--samples", type=int, default=2000, help="held-out images scored and k-NN / probe memory")
    parser.add_argument("--tiny", action="store_true", help="smoke run: the first model, 3 candidates, few images")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/fitness_vs_accuracy)")
    args = parse_args(parser, argv)
    torch.set_num_threads(1)
    log = Progress()
    models = args.models.split(",")[:1] if args.tiny else args.models.split(",")
    candidates = 3 if args.tiny else args.candidates
    sizes = {"train_samples": 200 if args.tiny else args.samples, "val_samples": 100 if args.tiny else args.samples}
    report = {"benchmark": "benchmarks/fitness_vs_accuracy.py", "tiny": args.tiny, "candidates": candidates,
              "sizes": sizes, "models": {m: measure(m, candidates, sizes, TINY if args.tiny else [], log) for m in models}}
    report["machine"] = machine_info()
    prefix = Path(args.out) if args.out else RESULTS / ("fitness_vs_accuracy_tiny" if args.tiny else "fitness_vs_accuracy")
    write_results(prefix, report, markdown, args)
    log(f"wrote {prefix}.md/.json")


if __name__ == "__main__":
    main()
