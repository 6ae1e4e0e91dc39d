"""How far a read-out of the raw pixels gets on each development task: the floor a pruned model cannot fall below
much, whatever it loses. A task whose pixels already classify well hides what pruning costs.

    python benchmarks/pixel_baselines.py            # both tasks (seconds)
    python benchmarks/pixel_baselines.py --tiny     # smoke run

Weighted k-NN and the linear probe of the evaluation suite (``snapvit_pl.eval``), on the normalised pixels instead of
a model's embedding, with ``compare_methods.py``'s sizes: 5000 train images as memory / probe training set, the whole
test split scored. Writes ``benchmarks/results/pixel_baselines.{md,json}``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, machine_info, parse_args, write_results  # noqa: E402
from snapvit_pl.data import ClassificationDataModule  # noqa: E402
from snapvit_pl.eval.knn import knn_classify  # noqa: E402
from snapvit_pl.eval.linear_probe import linear_probe  # noqa: E402

#: task -> (data source, input size, mean, std): the development models' own input pipelines
TASKS = {
    "fashion_mnist": ("fashion_mnist", 28, 0.2860, 0.3530),
    "fashion_mnist_clutter": ("fashion_mnist_clutter", 36, 0.1686, 0.3026),
}


def pixels(dm: ClassificationDataModule, split: str, count: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    batches = list(dm.labeled_dataloader(split, count or len(dm.base_dataset(split)), batch_size=1000))
    return torch.cat([x.flatten(1) for x, _ in batches]), torch.cat([y for _, y in batches])


def measure(task: str, train_samples: int, val_samples: Optional[int]) -> dict[str, Any]:
    source, size, mean, std = TASKS[task]
    dm = ClassificationDataModule(source=source, seed=0,
                                  data_config={"input_size": (1, size, size), "mean": (mean,), "std": (std,)})
    train, train_labels = pixels(dm, "train", train_samples)
    test, test_labels = pixels(dm, "val", val_samples)
    knn = knn_classify(train, train_labels, test, test_labels)["top1"]
    linear = linear_probe(train, train_labels, test, test_labels).test_accuracy
    print(f"{task}: pixels k-NN {100 * knn:.2f}, linear probe {100 * linear:.2f}", flush=True)
    return {"knn_top1": knn, "linear_top1": linear, "train_samples": len(train), "val_samples": len(test)}


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="smoke run: 300 / 200 images")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/pixel_baselines)")
    args = parse_args(parser, argv)
    torch.set_num_threads(1)
    sizes = (300, 200) if args.tiny else (5000, None)
    report = {"benchmark": "benchmarks/pixel_baselines.py", "tiny": args.tiny,
              "tasks": {task: measure(task, *sizes) for task in TASKS}, "machine": machine_info()}
    lines = ["# What the raw pixels give on each development task", "",
             f"`python benchmarks/pixel_baselines.py{' --tiny' if args.tiny else ''}`, {report['machine']['date']}. "
             "Weighted k-NN (k = 20) and the linear probe of the evaluation suite on the normalised pixels; "
             f"{sizes[0]} train images as memory / probe training set, "
             f"{'the whole test split' if sizes[1] is None else f'{sizes[1]} test images'} scored. Top-1 in %.", "",
             "| task | k-NN | linear probe |", "|---|---:|---:|"]
    lines += [f"| {task} | {100 * r['knn_top1']:.2f} | {100 * r['linear_top1']:.2f} |" for task, r in report["tasks"].items()]
    prefix = Path(args.out) if args.out else RESULTS / ("pixel_baselines_tiny" if args.tiny else "pixel_baselines")
    write_results(prefix, report, "\n".join(lines), args)


if __name__ == "__main__":
    main()
