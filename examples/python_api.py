"""snapvit-pl from Python: elastic scores for a ViT, then pruned models at any budget.

    python examples/python_api.py            # about a minute on 2 CPU cores, offline
    python examples/python_api.py --quick    # a smoke run (seconds)

Runs on the project's reference ViT (assets/reference_vit_fmnist) and Fashion-MNIST (Debian's
dataset-fashion-mnist): a plain DataLoader of unlabeled images is all the method needs.
"""
import argparse
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

import snapvit_pl
from snapvit_pl.data import ClassificationDataModule
from snapvit_pl.eval.suite import head_accuracy
from snapvit_pl.models import count_flops, count_params

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that everything runs")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny model: one thread is as fast and avoids OpenMP spin-waits on busy machines
    images, test_images = (64, 200) if args.quick else (1000, 2000)

    # 1. A pretrained timm ViT (here the reference model, saved in snapvit-pl's pruned-checkpoint format).
    model, _ = snapvit_pl.load_pruned(ROOT / "assets" / "reference_vit_fmnist")

    # 2. Unlabeled images in the model's input format: any DataLoader of [B, C, H, W] tensors will do.
    data = ClassificationDataModule(source="fashion_mnist", seed=0)
    data.configure_for_model(model)
    unlabeled = DataLoader(data.unlabeled_dataset("train", "plain", max_samples=images), batch_size=16)

    # 3. Rank every head and MLP neuron once (the default label-free score: how far removing each unit moves the
    #    embeddings), and choose how parameter and FLOPs budgets divide between heads and MLP neurons (by the same
    #    drift on 256 of the images, on a grid of budgets that any later budget interpolates).
    started = time.perf_counter()
    search = snapvit_pl.SearchSettings(num_images=min(images, 256), batch_size=256, pca_components=64)
    scores = snapvit_pl.fit_elastic(model, unlabeled, search=search)
    print(f"elastic scores in {time.perf_counter() - started:.0f} s")

    # 4. Any budget is one cut of that ranking: FLOPs, parameters, sparsity or prune ratios.
    budgets = {"dense": None, "flops=0.75": dict(flops=0.75), "sparsity=0.45": dict(sparsity=0.45),
               "sparsity=0.6": dict(sparsity=0.6)}
    test = data.labeled_dataloader("val", max_samples=test_images, batch_size=500)
    print(f"\n{'model':<13} {'params':>9} {'MFLOPs':>8} {'own-head top-1':>15}")
    for name, budget in budgets.items():
        small = model if budget is None else scores.extract(model, **budget)
        accuracy = head_accuracy(small, test, torch.device("cpu"))
        print(f"{name:<13} {count_params(small) / 1e6:>8.3f}M {count_flops(small) / 1e6:>8.1f} {100 * accuracy:>14.2f}%")
    print(f"\n(own head: the model's classifier, no retraining; {test_images} Fashion-MNIST test images)")


if __name__ == "__main__":
    main()
