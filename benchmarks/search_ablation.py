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
import copy
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.compare_methods import (  # noqa: E402
    PAIRS, REFERENCE, RESULTS, Progress, Settings, load_reference, local_scores, machine_info, round_floats,
    search_snapshots,
)
from snapvit_pl.data import ClassificationDataModule  # noqa: E402
from snapvit_pl.elastic import Budget, CostModel, ElasticScores, initial_coefficients  # noqa: E402
from snapvit_pl.evaluate import build_data, evaluate_model  # noqa: E402
from snapvit_pl.io import write_json_atomic, write_text_atomic  # noqa: E402
from snapvit_pl.models import fingerprint, prune_  # noqa: E402

METRICS = ["knn", "linear", "head"]
REPORTED = [("knn_top1", "k-NN"), ("linear_top1", "linear"), ("head_top1", "head")]


def run(args: argparse.Namespace) -> dict[str, Any]:
    log = Progress()
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = Settings.from_demo(quick=args.quick)
    checkpoints = [0, 3, 6] if args.quick else [int(c) for c in args.evaluations.split(",")]
    pairs = PAIRS[-1:] if args.quick else PAIRS[-3:]
    knn_train, knn_val = (300, 100) if args.quick else (args.knn_train, args.knn_val)
    model, spec, info = load_reference(Path(args.model))
    model.eval()
    dm = ClassificationDataModule(**dict(settings.data, seed=settings.seed))
    dm.configure_for_model(model)
    data = build_data(model, METRICS, dm.source, dm.root, knn_train, knn_val, settings.eval_batch, seed=settings.seed, cache=True)
    cost, base, base_fingerprint = CostModel(model), spec.to_dict(), fingerprint(model)
    rows: list[dict[str, Any]] = []

    def evaluate_at(method: str, local: ElasticScores, extra: dict[str, Any]) -> None:
        for mlp_ratio, head_ratio in pairs:
            subnet, _, _ = local.subnet(Budget(mlp_ratio=mlp_ratio, head_ratio=head_ratio), cost)
            metrics = evaluate_model(prune_(copy.deepcopy(model), subnet), data, METRICS, settings.knn_k, device="cpu")
            rows.append({"method": method, "pair": [mlp_ratio, head_ratio], **extra,
                         **{k: metrics[k] for k, _ in REPORTED if k in metrics}})
            log(f"{method} {extra} ({mlp_ratio}, {head_ratio}): "
                + ", ".join(f"{name} {100 * metrics[k]:.1f}" for k, name in REPORTED if k in metrics))

    initial = initial_coefficients(len(cost.num_heads), cost.num_heads, *settings.search["initial_range"])
    for reduction in args.reductions.split(","):
        scores = local_scores("ssl_fisher", model, dm, replace(settings, scorer_args=dict(settings.scorer_args, reduction=reduction)))
        local = ElasticScores(scores.heads, scores.neurons, None, base, base_fingerprint, settings.min_mlp_keep, settings.min_head_keep)
        log(f"ssl_fisher reduction={reduction}: local scores done; xNES snapshots at {checkpoints}")
        for i, sigma in enumerate(float(s) for s in args.sigmas.split(",")):
            search = dict(settings.search, sigma=sigma)
            for evaluations, snapshot in search_snapshots(model, dm, local, search, checkpoints).items():
                if evaluations == 0 and i > 0:
                    continue  # the initial coefficients do not depend on sigma
                log(f"  sigma {sigma}, {evaluations} evaluations: fitness {snapshot['initial_fitness']:.4f} -> "
                    f"{snapshot['best_fitness']:.4f}")
                local.coefficients = snapshot["coefficients"]
                evaluate_at("ssl_fisher", local, {"reduction": reduction, "sigma": sigma if evaluations else None,
                                                  "evaluations": evaluations, "fitness": snapshot["best_fitness"]})
    for baseline in ([] if args.quick else args.baselines.split(",")):
        scores = local_scores(baseline, model, dm, settings)
        local = ElasticScores(scores.heads, scores.neurons, initial, base, base_fingerprint, settings.min_mlp_keep, settings.min_head_keep)
        evaluate_at(baseline, local, {})
    report = {"benchmark": "benchmarks/search_ablation.py", "quick": args.quick, "model": info, "pairs": pairs,
              "knn_train": knn_train, "knn_val": knn_val, "search": settings.search, "machine": machine_info(),
              "total_s": round(time.perf_counter() - log.start, 1), "rows": round_floats(rows)}
    return report


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
    parser.add_argument("--model", default=str(REFERENCE))
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
