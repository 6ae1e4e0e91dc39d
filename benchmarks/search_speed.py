"""Search cost vs. the bare forward passes it needs (issue goal: ratio < 1.25). Not run in CI.

The search evaluates each candidate with gathered forwards (``use_subnet``) on a fixed image set.
The floor is the time of the same forwards on physically pruned copies, built outside the
timer. Both run the same images, batch size, precision and thread count.

    python benchmarks/search_speed.py [--evaluations 20] [--images 1000] [--model reference]
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import MODELS, RESULTS, model_overrides, parse_args, prune_setup, write_markdown  # noqa: E402
from snapvit_pl.device import autocast_context  # noqa: E402
from snapvit_pl.elastic import Budget, ElasticScores, initial_coefficients  # noqa: E402
from snapvit_pl.models import embed, fingerprint, prune_  # noqa: E402
from snapvit_pl.pipeline import SearchSettings, local_importance, run_search  # noqa: E402
from snapvit_pl.scoring import Magnitude  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=20)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--model", default="reference", help=f"a development model: {', '.join(MODELS)}")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: on a busy 2-core machine 2 threads can be 10x slower)")
    parser.add_argument("--out", default=str(RESULTS / "search_speed.md"))
    args = parse_args(parser)
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
    start = time.perf_counter()
    result = run_search(model, images, scores, settings, on_generation=lambda es, candidates, v: evaluated.extend(candidates))
    search_s = time.perf_counter() - start
    pairs = [Budget(mlp_ratio=m, head_ratio=h) for m, h in settings.sparsity_pairs]
    pruned = [prune_(copy.deepcopy(model), scores.subnet(b, coefficients=c)[0]) for c in evaluated for b in pairs]
    start = time.perf_counter()
    with torch.inference_mode(), autocast_context("cpu"):
        for m in pruned:
            for batch in images.split(args.batch_size):
                embed(m, batch)
    bare_s = time.perf_counter() - start

    result_row = {
        "model": args.model, "evaluations": args.evaluations, "note": "the search time includes the initial coefficients' evaluation, replayed in the bare forwards too", "images": images.shape[0], "batch_size": args.batch_size,
        "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "search_s": round(search_s, 3), "fitness_forward_s": round(result.forward_s, 3),
        "bare_pruned_forward_s": round(bare_s, 3), "ratio_search_to_bare": round(search_s / bare_s, 3),
        "per_evaluation_s": round(search_s / args.evaluations, 3),
    }
    print(json.dumps(result_row, indent=2))
    lines = ["# Search speed", "", "`python benchmarks/search_speed.py` (measured, not in CI).", "",
             "| " + " | ".join(result_row) + " |", "|" + "---|" * len(result_row),
             "| " + " | ".join(str(v) for v in result_row.values()) + " |"]
    write_markdown(Path(args.out), "\n".join(lines), args)


if __name__ == "__main__":
    main()
