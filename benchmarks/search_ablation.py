"""How much the xNES search and the SSL-Fisher reduction matter, on the reference ViT. Not run in CI.

    python benchmarks/search_ablation.py --threads 1 --sigmas 1.0,0.3   # 35 min on 2 busy CPU cores
    python benchmarks/search_ablation.py --quick --threads 1             # smoke run (~2 min)

For each local-score reduction (``squared_sum``, the reference code's, and ``fisher``, the paper's
formula) the SSL-Fisher scores are computed once, then one xNES run (search settings of
configs/prune/demo.yaml) is snapshotted at several evaluation counts (0 = the initial coefficients).
Every snapshot's best coefficients are cut at the sparsest paper pairs and evaluated (k-NN, linear
probe, own head), next to the strongest baselines of ``compare_methods.py`` at the same pairs.
Writes ``benchmarks/results/search_ablation.{md,json}``.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, Progress, machine_info, model_overrides, prune_setup, rounded  # noqa: E402
from benchmarks.compare_methods import CachedEvaluation, Settings, evaluation_data, method_scores  # noqa: E402
from snapvit_pl.elastic import PAPER_PAIRS, Budget  # noqa: E402
from snapvit_pl.io import write_json_atomic, write_text_atomic  # noqa: E402
from snapvit_pl.pipeline import EvaluationSettings, extract_models, search_snapshots  # noqa: E402
from snapvit_pl.scoring import SSLFisher  # noqa: E402

REPORTED = [("knn_top1", "k-NN"), ("linear_top1", "linear"), ("head_top1", "head")]


def run(args: argparse.Namespace) -> dict[str, Any]:
    log = Progress()
    if args.threads:
        torch.set_num_threads(args.threads)
    quick = ["--data.init_args.max_samples=64", "--search.num_images=64", "--search.pca_components=16"] if args.quick else []
    checkpoints = [0, 3, 6] if args.quick else [int(c) for c in args.evaluations.split(",")]
    pairs = PAPER_PAIRS[-1:] if args.quick else PAPER_PAIRS[-3:]
    settings = Settings(models=[args.model], train_samples=300 if args.quick else args.knn_train,
                        val_samples=100 if args.quick else args.knn_val)
    setup = prune_setup(*model_overrides(args.model), *quick)
    evaluation = CachedEvaluation(EvaluationSettings(metrics=["knn", "linear", "head"], train_samples=settings.train_samples,
                                                     val_samples=settings.val_samples),
                                  evaluation_data(setup, settings), device=torch.device("cpu"))
    budgets = [Budget(mlp_ratio=m, head_ratio=h) for m, h in pairs]
    rows: list[dict[str, Any]] = []

    def evaluate_at(method: str, scores, extra: dict[str, Any]) -> None:
        for item in extract_models(setup.model, scores, budgets, evaluation=evaluation):
            rows.append({"method": method, "pair": [item.mlp_ratio, item.head_ratio], **extra,
                         **{k: item.metrics[k] for k, _ in REPORTED if k in item.metrics}})
            log(f"{method} {extra} ({item.mlp_ratio}, {item.head_ratio}): "
                + ", ".join(f"{name} {100 * item.metrics[k]:.1f}" for k, name in REPORTED if k in item.metrics))

    for reduction in args.reductions.split(","):
        reduced = replace(setup, importance=replace(setup.importance, scorer=SSLFisher(setup.importance.scorer.n_global,
                                                                                       reduction)))
        scores, _ = method_scores("ssl_fisher", reduced, 0, "none", log, {})
        images = setup.datamodule.unlabeled_images(setup.search.num_images, setup.search.batch_size)
        log(f"ssl_fisher reduction={reduction}: local scores done; search snapshots at {checkpoints}")
        for i, sigma in enumerate(float(s) for s in args.sigmas.split(",")):
            snapshots = search_snapshots(setup.model, images, scores, replace(setup.search, sigma=sigma), checkpoints)
            for evaluations, snapshot in snapshots.items():
                if evaluations == 0 and i > 0:
                    continue  # the initial coefficients do not depend on sigma
                scores.coefficients = snapshot.coefficients
                evaluate_at("ssl_fisher", scores, {"reduction": reduction, "sigma": sigma if evaluations else None,
                                                   "evaluations": evaluations, "fitness": snapshot.best_fitness})
    for baseline in ([] if args.quick else args.baselines.split(",")):
        scores, _ = method_scores(baseline, setup, 0, "initial", log, {})
        evaluate_at(baseline, scores, {})
    return {"benchmark": "benchmarks/search_ablation.py", "quick": args.quick, "model": {"source": args.model},
            "pairs": [list(p) for p in pairs], "knn_train": settings.train_samples, "knn_val": settings.val_samples,
            "search": setup.search.to_dict(), "machine": machine_info(), "total_s": round(time.perf_counter() - log.start, 1),
            "rows": rounded(rows)}


def markdown(report: dict[str, Any]) -> str:
    pairs = [tuple(p) for p in report["pairs"]]
    lines = ["# xNES search budget and SSL-Fisher reduction (no retraining)", "",
             f"`python benchmarks/search_ablation.py`, {report['machine']['date']}, {report['machine']['torch_threads']} torch "
             f"thread(s), total {report['total_s'] / 60:.1f} min. Model: {report['model']['source']}. xNES settings of "
             f"configs/prune/demo.yaml ({report['search']['num_images']} images, PCA {report['search']['pca_components']}, "
             f"popsize {report['search']['popsize'] or 'default'}; the demo's sigma is {report['search']['sigma']}); "
             f"evaluations = 0 is the initial coefficients. The snapshots come from one continued run whose "
             f"generation in progress is cut short at each snapshot, so a row is close to, not bit-identical with, "
             f"a plain run of that many evaluations. Top-1 in % on {report['knn_val']} balanced test images (standard error ~"
             f"{100 * (0.12 / report['knn_val']) ** 0.5:.1f} points near 88%); k-NN memory / probe train set "
             f"{report['knn_train']} images.", ""]
    header = "| method | reduction | sigma | evaluations | fitness | " + " | ".join(
        f"{name} {p}" for p in pairs for _, name in REPORTED) + " |"
    lines += [header, "|" + "---|" * (5 + len(pairs) * len(REPORTED))]
    groups: dict[tuple, dict[tuple, dict]] = {}
    for row in report["rows"]:
        key = (row["method"], row.get("reduction", ""), row.get("sigma") or "", row.get("evaluations", ""), row.get("fitness"))
        groups.setdefault(key, {})[tuple(row["pair"])] = row
    for (method, reduction, sigma, evaluations, fitness), by_pair in groups.items():
        cells = [f"{100 * by_pair[p][k]:.1f}" if p in by_pair and k in by_pair[p] else "" for p in pairs for k, _ in REPORTED]
        lines.append(f"| {method} | {reduction} | {sigma} | {evaluations} | {'' if fitness is None else f'{fitness:.4f}'} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, 1 pair, 6 evaluations")
    parser.add_argument("--evaluations", default="0,25,50,100", help="xNES evaluation counts to snapshot")
    parser.add_argument("--sigmas", default="1.0", help="initial xNES step sizes, one search each")
    parser.add_argument("--reductions", default="squared_sum,fisher", help="SSL-Fisher reductions to compare")
    parser.add_argument("--baselines", default="snip_magnitude,label_fisher", help="baselines evaluated alongside")
    parser.add_argument("--knn-train", type=int, default=10000)
    parser.add_argument("--knn-val", type=int, default=5000)
    parser.add_argument("--model", default="reference", help="a development model of benchmarks/common.py")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 avoids OpenMP contention on a busy machine)")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/search_ablation[_quick])")
    args = parser.parse_args()
    report = run(args)
    prefix = Path(args.out) if args.out else RESULTS / ("search_ablation_quick" if args.quick else "search_ablation")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(prefix.with_suffix(".json"), report)
    write_text_atomic(prefix.with_suffix(".md"), markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
