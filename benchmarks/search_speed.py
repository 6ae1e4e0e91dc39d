"""Search cost vs. the bare forward passes it needs (issue goal: ratio < 1.25). Not run in CI.

The search evaluates each candidate with gathered forwards (``use_subnet``) on a fixed image set.
The floor is the time of the same forwards on physically pruned copies, built outside the
timer. Both run the same images, batch size, precision and thread count, as a pair in each of
``--rounds`` rounds (alternating which goes first); the ratio is taken per round, and its median,
minimum and maximum are reported.

    python benchmarks/search_speed.py [--evaluations 20] [--images 1000] [--rounds 3] [--model reference]
"""
from __future__ import annotations

import argparse
import copy
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import MODELS, RESULTS, machine_info, model_overrides, parse_args, prune_setup, write_results  # noqa: E402
from snapvit_pl.device import autocast_context  # noqa: E402
from snapvit_pl.elastic import Budget, ElasticScores, initial_coefficients  # noqa: E402
from snapvit_pl.models import embed, fingerprint, prune_  # noqa: E402
from snapvit_pl.pipeline import SearchSettings, local_importance, run_search  # noqa: E402
from snapvit_pl.scoring import Magnitude  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=20)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the pair (search, bare forwards)")
    parser.add_argument("--model", default="reference", help=f"a development model: {', '.join(MODELS)}")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: on a busy 2-core machine 2 threads can be 10x slower)")
    parser.add_argument("--out", default=str(RESULTS / "search_speed"), help="output prefix (.json and .md)")
    args = parse_args(parser, argv)
    torch.set_num_threads(args.threads)

    setup = prune_setup(*model_overrides(args.model))
    model = setup.model
    images = setup.datamodule.unlabeled_images(args.images, batch_size=500)
    local = local_importance(Magnitude(), model, [])
    scores = ElasticScores(local.heads, local.neurons, None, fingerprint=fingerprint(model))
    settings = SearchSettings(max_evaluations=args.evaluations, num_images=args.images, batch_size=args.batch_size,
                              pca_components=setup.search.pca_components, seed=0)
    # the search evaluates the initial coefficients, then every candidate: replay the same sub-networks
    evaluated = [initial_coefficients(len(local.heads), [len(h) for h in local.heads], *settings.initial_range)]

    def search() -> float:
        start = time.perf_counter()
        run_search(model, images, scores, settings,
                   on_generation=lambda es, candidates, v: evaluated.extend(candidates) if not pruned else None)
        return time.perf_counter() - start

    def bare() -> float:
        start = time.perf_counter()
        with torch.inference_mode(), autocast_context("cpu"):
            for m in pruned:
                for batch in images.split(args.batch_size):
                    embed(m, batch)
        return time.perf_counter() - start

    pruned: list = []
    first = search()  # (the candidates to replay; the search is seeded: every round evaluates the same ones)
    pairs = [Budget(mlp_ratio=m, head_ratio=h) for m, h in settings.sparsity_pairs]
    pruned = [prune_(copy.deepcopy(model), scores.subnet(b, coefficients=c)[0]) for c in evaluated for b in pairs]
    rounds = []
    for r in range(args.rounds):
        if r == 0:
            search_s, bare_s = first, bare()
        elif r % 2:
            bare_s = bare()
            search_s = search()
        else:
            search_s, bare_s = search(), bare()
        rounds.append({"search_s": search_s, "bare_s": bare_s, "ratio": search_s / bare_s})
        print(f"round {r + 1}: search {search_s:.1f} s, bare forwards {bare_s:.1f} s, ratio {search_s / bare_s:.3f}",
              flush=True)
    ratios = [r["ratio"] for r in rounds]
    report = {"model": args.model, "evaluations": args.evaluations, "images": images.shape[0],
              "batch_size": args.batch_size, "threads": torch.get_num_threads(),
              "cpu": platform.processor() or platform.machine(), "rounds": rounds,
              "search_s": statistics.median(r["search_s"] for r in rounds),
              "bare_s": statistics.median(r["bare_s"] for r in rounds),
              "ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
              "machine": machine_info()}
    write_results(Path(args.out), report, markdown, args)
    print(markdown(report))


def markdown(report: dict) -> str:
    ratio = report["ratio"]
    lines = ["# Search speed", "",
             f"`python benchmarks/search_speed.py`: {report['model']} model, {report['evaluations']} evaluations of the "
             f"search's sparsity pairs on {report['images']} images (batch {report['batch_size']}), "
             f"{report['threads']} torch thread(s), against the bare forwards of the same pruned models (the initial "
             "coefficients' evaluation replayed too), as a pair in each round (alternating which goes first). Ratio: "
             f"median {ratio['median']:.3f} (min {ratio['min']:.3f}, max {ratio['max']:.3f}) over "
             f"{len(report['rounds'])} rounds.", "",
             "| round | search s | bare forwards s | ratio |", "|---:|---:|---:|---:|"]
    lines += [f"| {i + 1} | {r['search_s']:.2f} | {r['bare_s']:.2f} | {r['ratio']:.3f} |"
              for i, r in enumerate(report["rounds"])]
    lines += [f"| median | {report['search_s']:.2f} | {report['bare_s']:.2f} | {ratio['median']:.3f} |"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
