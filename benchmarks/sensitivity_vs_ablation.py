"""How well the default score predicts what removing a unit really does: the output-sensitivity score of every head
(and of a sample of MLP neurons) against the exact drift of removing that unit alone.

    OMP_NUM_THREADS=1 python benchmarks/sensitivity_vs_ablation.py            # every development model
    python benchmarks/sensitivity_vs_ablation.py --tiny                      # smoke run (seconds)

The score is the default ``prune.py`` run's (``configs/prune/demo.yaml``: :class:`OutputSensitivity` on the pruning
images); the exact drift is the split fitness of the sub-network without that one unit (``1 - cos`` of the PCA'd
embeddings against the dense model's, on the fitness images: one pruned forward pass per unit). Reported: the
Spearman rank correlation over all heads, and over ``--neurons`` neurons drawn from the middle block. Writes
``benchmarks/results/sensitivity_vs_ablation.{md,json}``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    MODELS, RESULTS, Progress, machine_info, model_overrides, parse_args, prune_setup, write_results,
)
from snapvit_pl.elastic import ElasticScores  # noqa: E402
from snapvit_pl.models import Subnet, prunable_blocks  # noqa: E402
from snapvit_pl.pipeline import local_importance, scoring_views  # noqa: E402
from snapvit_pl.search.fitness import EmbeddingFitness  # noqa: E402

TINY = ["--data.init_args.max_samples=32", "--search.num_images=32", "--search.pca_components=8"]


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation (ties by position: the scores here are continuous)."""
    ranks = [torch.argsort(torch.argsort(x.double())).double() for x in (a, b)]
    ranks = [r - r.mean() for r in ranks]
    return float((ranks[0] @ ranks[1]) / (ranks[0].norm() * ranks[1].norm()))


def measure(model_name: str, neurons: int, overrides: list[str], log: Progress) -> dict[str, Any]:
    setup = prune_setup(*model_overrides(model_name), *overrides)
    model, dm = setup.model, setup.datamodule
    scorer = setup.importance.scorer
    started = time.perf_counter()
    dm.train_views = scoring_views(scorer)
    local = local_importance(scorer, model, dm.train_dataloader())
    scoring_s = time.perf_counter() - started
    images = dm.unlabeled_images(setup.search.num_images, setup.search.batch_size)
    blocks = prunable_blocks(model)
    placeholder = ElasticScores([torch.ones(b.heads.num_units) for b in blocks],
                                [torch.ones(b.neurons.num_units) for b in blocks])
    fitness = EmbeddingFitness(model, images, placeholder, setup.search, pairs=[(0.0, 0.0)])

    def drift_without(block: int, kind: str, unit: int) -> float:
        subnet = Subnet.full(model)
        kept = getattr(subnet, kind)[block]
        getattr(subnet, kind)[block] = kept[kept != unit]
        return fitness.distance(subnet)

    started = time.perf_counter()
    head_scores = torch.cat(local.heads)
    head_drift = torch.tensor([drift_without(b, "heads", h) for b, block in enumerate(blocks)
                               for h in range(block.heads.num_units)])
    middle = len(blocks) // 2
    width = blocks[middle].neurons.num_units
    sample = torch.randperm(width, generator=torch.Generator().manual_seed(0))[:min(neurons, width)].sort().values
    neuron_drift = torch.tensor([drift_without(middle, "neurons", int(n)) for n in sample])
    ablation_s = time.perf_counter() - started
    result = {"heads": len(head_scores), "heads_spearman": spearman(head_scores, head_drift),
              "neuron_block": middle, "neurons": len(sample),
              "neurons_spearman": spearman(local.neurons[middle][sample], neuron_drift),
              "fitness_images": len(images), "scoring_s": scoring_s, "ablation_s": ablation_s}
    log(f"{model_name}: heads Spearman {result['heads_spearman']:.3f} ({result['heads']} heads), neurons of block "
        f"{middle} {result['neurons_spearman']:.3f} ({result['neurons']})")
    return result


def markdown(report: dict[str, Any]) -> str:
    lines = ["# The default score against exact single-unit ablation", "",
             f"`python benchmarks/sensitivity_vs_ablation.py{' --tiny' if report['tiny'] else ''}`, "
             f"{report['machine']['date']}, {report['machine']['cpu']} ({report['machine']['torch_threads']} torch "
             f"thread(s)). The default scorer's score of each unit (the `prune.py` defaults of "
             "`configs/prune/demo.yaml`) against the drift of the sub-network without that unit alone (the split "
             "fitness on the fitness images); Spearman rank correlation.", "",
             "| model | heads | Spearman (heads) | MLP neurons sampled (block) | Spearman (neurons) |",
             "|---|---:|---:|---:|---:|"]
    for name, r in report["models"].items():
        lines.append(f"| {name} | {r['heads']} | {r['heads_spearman']:.3f} | {r['neurons']} ({r['neuron_block']}) | "
                     f"{r['neurons_spearman']:.3f} |")
    lines += ["", "Single neurons move the embedding very little (many drifts are at float resolution), so their "
              "correlation is lower than the heads' even when the ranking of groups of neurons is right."]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"subset of {','.join(MODELS)}")
    parser.add_argument("--neurons", type=int, default=48, help="MLP neurons of the middle block to ablate")
    parser.add_argument("--tiny", action="store_true", help="smoke run: the first model, few images and neurons")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/sensitivity_vs_ablation)")
    args = parse_args(parser, argv)
    torch.set_num_threads(1)
    log = Progress()
    models = args.models.split(",")[:1] if args.tiny else args.models.split(",")
    report = {"benchmark": "benchmarks/sensitivity_vs_ablation.py", "tiny": args.tiny,
              "models": {m: measure(m, 4 if args.tiny else args.neurons, TINY if args.tiny else [], log) for m in models}}
    report["machine"] = machine_info()
    prefix = Path(args.out) if args.out else RESULTS / ("sensitivity_vs_ablation_tiny" if args.tiny else "sensitivity_vs_ablation")
    write_results(prefix, report, markdown, args)
    log(f"wrote {prefix}.md/.json")


if __name__ == "__main__":
    main()
