"""The fine-tuning recipe (configs/train/finetune_pruned.yaml) on a pruned model: accuracy before and after.

    python benchmarks/finetune_recipe.py --checkpoint runs/prune/<run>/models/sparsity0.6
    python benchmarks/finetune_recipe.py --checkpoint ... --quick          # smoke run: a few batches

Runs ``train.py fit --config configs/train/finetune_pruned.yaml --model.checkpoint <checkpoint>`` (the
recipe as users run it: distillation from the recorded base, lr 1e-4, two epochs) into a temporary
directory, and evaluates the checkpoint before and the exported model after it on the whole
Fashion-MNIST test split (own head, linear probe and k-NN, 10 000 train images as memory). Writes
``benchmarks/results/finetune_recipe.{json,md}``.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, ROOT, display, machine_info, parse_args, pct, write_results  # noqa: E402
from snapvit_pl.cli import train_main  # noqa: E402
from snapvit_pl.data import ClassificationDataModule  # noqa: E402
from snapvit_pl.eval.suite import EvalData, EvaluationSettings, evaluate_model  # noqa: E402
from snapvit_pl.models import load_pruned  # noqa: E402

RECIPE = ROOT / "configs" / "train" / "finetune_pruned.yaml"
REPORTED = (("head_top1", "own head"), ("linear_top1", "linear probe"), ("knn_top1", "k-NN"))


def evaluate(path: Path, train: int, val: int | None) -> dict[str, Any]:
    model, _ = load_pruned(path)
    dm = ClassificationDataModule(source="fashion_mnist", seed=0)
    dm.configure_for_model(model)
    settings = EvaluationSettings(metrics=["knn", "linear", "head"], train_samples=train, val_samples=val,
                                  batch_size=256)  # val None: the whole test split
    return evaluate_model(model, EvalData.from_datamodule(dm, settings), settings, device="cpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a pruned checkpoint written by prune.py")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a few training batches, small evaluation")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/finetune_recipe[_quick])")
    args = parse_args(parser, argv)
    torch.set_num_threads(args.threads)
    train, val = (300, 200) if args.quick else (10000, None)
    checkpoint = Path(args.checkpoint)
    started = time.perf_counter()
    before = evaluate(checkpoint, train, val)
    print("before: " + ", ".join(f"{name} {pct(before[k], 2)}" for k, name in REPORTED), flush=True)
    with tempfile.TemporaryDirectory(prefix="finetune_recipe_") as tmp:
        extra = ["--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2", "--trainer.max_epochs=1"] if args.quick else []
        tuned_started = time.perf_counter()
        code = train_main(["fit", "--config", str(RECIPE), f"--model.checkpoint={checkpoint}",
                           f"--trainer.default_root_dir={tmp}", "--trainer.enable_progress_bar=false", *extra])
        if code != 0:
            return code
        finetune_s = time.perf_counter() - tuned_started
        after = evaluate(Path(tmp) / "model", train, val)
    print("after: " + ", ".join(f"{name} {pct(after[k], 2)}" for k, name in REPORTED), flush=True)
    report = {"benchmark": "benchmarks/finetune_recipe.py", "quick": args.quick, "checkpoint": display(checkpoint),
              "recipe": display(RECIPE), "before": before, "after": after, "finetune_s": finetune_s,
              "change": {k: after[k] - before[k] for k, _ in REPORTED}, "machine": machine_info(),
              "total_s": time.perf_counter() - started}
    prefix = Path(args.out) if args.out else RESULTS / ("finetune_recipe_quick" if args.quick else "finetune_recipe")
    lines = ["# The fine-tuning recipe on a pruned model", "",
             f"`python benchmarks/finetune_recipe.py --checkpoint {report['checkpoint']}`, {report['machine']['date']}: "
             f"`{report['recipe']}` as is ({finetune_s / 60:.1f} min of training on {args.threads} CPU threads), "
             f"evaluated on {'the whole test split' if val is None else f'{val} test images'} ({train} train images as "
             "k-NN memory and probe training set).", "",
             "| | " + " | ".join(name for _, name in REPORTED) + " |", "|---|" + "---:|" * len(REPORTED),
             "| before | " + " | ".join(pct(before[k], 2) for k, _ in REPORTED) + " |",
             "| after | " + " | ".join(pct(after[k], 2) for k, _ in REPORTED) + " |",
             "| change | " + " | ".join(f"{100 * report['change'][k]:+.2f}" for k, _ in REPORTED) + " |", ""]
    write_results(prefix, report, "\n".join(lines), args)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
