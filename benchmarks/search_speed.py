"""Search cost vs. the bare forward passes it needs (issue goal: ratio < 1.25). Not run in CI.

The search evaluates each candidate with gathered forwards (``use_subnet``) on a fixed image set.
The floor is the time of the same forwards on physically pruned copies, built outside the
timer. Both run the same images, batch size, precision and thread count.

    python benchmarks/search_speed.py [--evaluations 20] [--images 1000] [--checkpoint DIR]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # snapvit_pl when run as a script without installing

from snapvit_pl.data import ClassificationDataModule  # noqa: E402
from snapvit_pl.elastic import ElasticScores, initial_coefficients  # noqa: E402
from snapvit_pl.models import BackboneSpec, embed, fingerprint, load_backbone, load_pruned, prunable_blocks, prune_  # noqa: E402
from snapvit_pl.scoring import Magnitude  # noqa: E402
from snapvit_pl.search import XNES  # noqa: E402
from snapvit_pl.search.fitness import EmbeddingFitness, autocast_for  # noqa: E402

DEMO = BackboneSpec("vit_tiny_patch16_224", False, None, {
    "img_size": 28, "patch_size": 4, "in_chans": 1, "embed_dim": 96, "depth": 6, "num_heads": 6, "num_classes": 10,
})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=20)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--checkpoint", default=str(ROOT / "assets" / "reference_vit_fmnist"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "search_speed.md"))
    args = parser.parse_args()

    if (Path(args.checkpoint) / "model.safetensors").exists():
        model, record = load_pruned(args.checkpoint)
        name = record["base"]["model_name"] + f" ({args.checkpoint})"
    else:
        model, name = load_backbone(DEMO), "random-weight demo ViT (no reference checkpoint found)"
    model.eval()
    datamodule = ClassificationDataModule(source="fashion_mnist", seed=0)
    datamodule.configure_for_model(model)
    images = datamodule.unlabeled_images(args.images, batch_size=500)
    local = Magnitude()
    local.setup(model)
    scores = local.compute()
    blocks = prunable_blocks(model)
    elastic = ElasticScores(scores.heads, scores.neurons, None, fingerprint=fingerprint(model))
    fitness = EmbeddingFitness(model, images, elastic, batch_size=args.batch_size)
    es = XNES(initial_coefficients(len(blocks), [b.heads.num_units for b in blocks]), seed=0)

    evaluated = []
    start = time.perf_counter()
    while es.evaluations < args.evaluations:
        candidates = es.ask()[: args.evaluations - es.evaluations]
        values = torch.tensor([fitness(c) for c in candidates])
        es.tell(candidates, values)
        evaluated += list(candidates)
    search_s = time.perf_counter() - start

    pruned = [prune_(copy.deepcopy(model), elastic.subnet(b, coefficients=c)[0]) for c in evaluated for b in fitness.pairs]
    start = time.perf_counter()
    with torch.inference_mode(), autocast_for("cpu"):
        for m in pruned:
            for batch in images.split(args.batch_size):
                embed(m, batch)
    bare_s = time.perf_counter() - start

    result = {
        "model": name, "evaluations": args.evaluations, "images": images.shape[0], "batch_size": args.batch_size,
        "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "search_s": round(search_s, 3), "fitness_forward_s": round(fitness.forward_seconds, 3),
        "bare_pruned_forward_s": round(bare_s, 3), "ratio_search_to_bare": round(search_s / bare_s, 3),
        "per_evaluation_s": round(search_s / args.evaluations, 3),
    }
    print(json.dumps(result, indent=2))
    lines = ["# Search speed", "", "`python benchmarks/search_speed.py` (measured, not in CI).", "",
             "| " + " | ".join(result) + " |", "|" + "---|" * len(result), "| " + " | ".join(str(v) for v in result.values()) + " |"]
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
