"""The command lines, one module per command, all in one dialect (:mod:`.common`).

``snapvit-pl COMMAND [OPTIONS]`` runs any of them (the ``snapvit-pl`` console script); ``python prune.py``,
``python train.py`` and ``python -m snapvit_pl.extract|evaluate|deploy|hub`` run the same code.
"""
from __future__ import annotations

import importlib
import sys
from typing import Optional

from .prune import prune_cli, prune_main
from .train import finetune_dir, train_main

#: command -> (module, what it does)
COMMANDS = {
    "prune": ("prune", "rank every head and MLP neuron of a pretrained ViT, cut models at budgets, report"),
    "train": ("train", "fine-tune a pruned model (or train a dense one): fit, validate, test"),
    "pretrain": ("train", "train a ViT without labels by DINO self-distillation (a backbone to prune)"),
    "extract": ("extract", "cut models at any budget from a run's elastic scores"),
    "evaluate": ("evaluate", "k-NN, linear probe, own head, segmentation, throughput of one model"),
    "deploy": ("deploy", "export a pruned model to ONNX (check it, time it)"),
    "hub": ("hub", "publish a pruned model on the Hugging Face Hub with a model card"),
}
USAGE = "usage: snapvit-pl COMMAND [--help] [OPTIONS]\n\ncommands:\n" + "\n".join(
    f"  {name:<9} {text}" for name, (_, text) in COMMANDS.items()) + \
    "\n\n`snapvit-pl COMMAND --help` lists a command's options; `snapvit-pl --version` prints the version."

__all__ = ["COMMANDS", "finetune_dir", "main", "prune_cli", "prune_main", "train_main"]


def version() -> str:
    """The version of snapvit-pl (:func:`snapvit_pl.version.package_version`)."""
    from ..version import package_version

    return package_version()


def main(argv: Optional[list[str]] = None) -> int:
    """``snapvit-pl COMMAND ...``: run one command; returns the exit status."""
    from .common import reexec_in_utf8_mode, reopen_closed_standard_streams

    reopen_closed_standard_streams()  # (before anything is printed or opened)
    if argv is None:
        reexec_in_utf8_mode()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"snapvit-pl {version()}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}; choose one of {', '.join(COMMANDS)} (snapvit-pl --help)",
              file=sys.stderr)
        return 2
    from .common import dispatched

    module = importlib.import_module(f".{COMMANDS[command][0]}", __name__)
    entry = {"prune": "prune_main", "train": "train_main", "pretrain": "pretrain_main"}.get(command, "main")
    with dispatched():  # its messages name snapvit-pl COMMAND
        return getattr(module, entry)(rest)
