"""The README's "Prune your own model" commands, run verbatim on the full-size DINO ViT-B/16 with a tiny stand-in
for ImageNet: the model is the real architecture at 224 px (random weights, served by an offline Hugging Face
cache laid out here, so ``pretrained: true`` loads for real), the data a few synthetic images in ImageNet's layout
(class folders for train, a flat val folder and LOC_val_solution.csv), and every command gets options that shrink
its work (fewer images, one training step; two evaluations of the optional coefficient search, so that it
too runs at full size) appended.

    python benchmarks/readme_walkthrough.py          # writes benchmarks/results/readme_walkthrough.{json,md}

tests/cli/test_readme_walkthrough.py runs the same function in CI with two of the model's twelve blocks (``depth``),
from the offline cache and with random weights: what the README says works on a fresh clone, in a minute each.
The record holds each command's wall time and the pruning run's per-stage time and peak memory (process peak
RSS on CPU), with the machine.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MODEL = "vit_base_patch16_224.dino"  # what configs/prune/dino_vitb16.yaml names
DATA = "/data/imagenet"  # the README's data root, replaced by the stand-in
#: Options appended to each command so that the full-size model runs in minutes on a CPU.
SHRINK = {
    "prune": ["--data.init_args.max_samples=4", "--data.init_args.batch_size=2", "--data.init_args.num_workers=0",
              "--importance.scorer.init_args.max_steps=256",  # the greedy order over ViT-B's 37,008 units in 256 steps
              "--search.max_evaluations=2", "--search.popsize=2",  # the optional search too, at full size
              "--search.num_images=4", "--search.batch_size=4", "--search.pca_components=4",
              "--export.split_candidates=2", "--export.split_grid=0", "--evaluation.train_samples=4",
              "--evaluation.val_samples=4", "--evaluation.knn_k=2", "--evaluation.batch_size=4",
              "--trainer.accelerator=cpu", "--report.print_table=false"],
    "extract": [],
    "evaluate": ["--data.init_args.num_workers=0", "--evaluation.train_samples=4", "--evaluation.val_samples=4",
                 "--evaluation.knn_k=2", "--evaluation.batch_size=4", "--device=cpu"],
    "train": ["--data.init_args.max_samples=2", "--data.init_args.batch_size=2", "--data.init_args.num_workers=0",
              "--trainer.max_epochs=1", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1",
              "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false"],
    "deploy": [],
}
WNIDS = ("n01440764", "n01443537")
#: ``random_weights``: what the prune command also gets (no weights to load: random ones from the run's seed, which
#: every later command rebuilds from the record).
RANDOM_WEIGHTS = ["--model.pretrained=false"]


def readme_commands(readme: Path = README) -> list[list[str]]:
    """The commands of the README's walkthrough block, as argument lists (comments dropped, lines joined)."""
    text = readme.read_text()
    block = re.search(r"<!-- walkthrough.*?-->\s*```bash\n(.*?)```", text, re.S)
    if block is None:
        raise ValueError(f"{readme} has no walkthrough block")
    joined = re.sub(r"\\\n\s*", " ", block.group(1))
    return [shlex.split(line) for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def stand_in_imagenet(root: Path, train_per_class: int = 4, val: int = 4) -> Path:
    """Synthetic JPEGs in ImageNet's layout: ``train/<wnid>/*.JPEG``, a flat ``val/`` and ``LOC_val_solution.csv``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for wnid in WNIDS:
        (root / "train" / wnid).mkdir(parents=True, exist_ok=True)
        for i in range(train_per_class):
            Image.fromarray(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)).save(
                root / "train" / wnid / f"{wnid}_{i}.JPEG", format="JPEG")
    (root / "val").mkdir(parents=True, exist_ok=True)
    rows = ["ImageId,PredictionString"]
    for i in range(val):
        name = f"ILSVRC2012_val_{i + 1:08d}"
        Image.fromarray(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)).save(root / "val" / f"{name}.JPEG",
                                                                                 format="JPEG")
        rows.append(f"{name},{WNIDS[i % len(WNIDS)]} 1 2 60 80")
    (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    return root


def offline_hub(home: Path, depth: Optional[int] = None) -> dict[str, str]:
    """An offline Hugging Face cache holding random weights of ``MODEL`` (full size, or with ``depth`` blocks);
    returns the environment that makes timm read it."""
    import hashlib

    import timm
    import torch
    from timm.models._hub import save_for_hf

    repo = f"timm/{MODEL}"
    folder = home / "hub" / f"models--{repo.replace('/', '--')}"
    revision = hashlib.sha1(repo.encode()).hexdigest()
    snapshot = folder / "snapshots" / revision
    if not (snapshot / "model.safetensors").is_file():
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text(revision)
        snapshot.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        blocks = {} if depth is None else {"depth": depth}
        save_for_hf(timm.create_model(MODEL, pretrained=False, num_classes=0, **blocks), str(snapshot),
                    safe_serialization=True)
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}


def run_walkthrough(workdir: Path, threads: Optional[int] = 1, log: Any = print,
                    random_weights: bool = False, depth: Optional[int] = None) -> dict[str, Any]:
    """Run the README's walkthrough in ``workdir`` (its ``runs/`` and outputs land there); returns what it measured.

    Args:
        random_weights: prune ``--model.pretrained false`` (:data:`RANDOM_WEIGHTS`) with an empty Hugging Face
            cache and ``HF_HUB_OFFLINE=1``, instead of the weights from a laid-out offline cache.
        depth: the model with ``depth`` blocks (``--model.model_kwargs.depth``, and the cache's weights); None: the
            full size.

    Raises:
        RuntimeError: a command failed (its status and the end of its error output).
    """
    workdir = Path(workdir)
    data = stand_in_imagenet(workdir / "imagenet")
    hub = {"HF_HOME": str(workdir / "hf_home"), "HF_HUB_OFFLINE": "1"} if random_weights else \
        offline_hub(workdir / "hf_home", depth)
    env = {**os.environ, **hub, "PYTHONUNBUFFERED": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # the pruning run's own options: random weights (no cache), fewer blocks
    prune_extra = (RANDOM_WEIGHTS if random_weights else []) + \
        ([] if depth is None else [f"--model.model_kwargs.depth={depth}"])
    commands = []
    for argv in readme_commands():
        argv = [str(data) if a == DATA else a for a in argv]
        argv = [str(ROOT / a) if a.startswith("configs/") else a for a in argv]  # the checkout's configs
        command = argv[1] if argv[0] == "snapvit-pl" else Path(argv[0]).stem
        appended = SHRINK[command] + (prune_extra if command == "prune" else [])
        full = argv + appended
        started = time.perf_counter()
        result = subprocess.run(full, cwd=workdir, env=env, capture_output=True, text=True, timeout=1800)
        seconds = time.perf_counter() - started
        log(f"{command}: {seconds:.0f} s (status {result.returncode})")
        if result.returncode != 0:
            raise RuntimeError(f"`{shlex.join(argv)}` failed with status {result.returncode}:\n{result.stderr[-3000:]}")
        commands.append({"command": shlex.join(argv), "appended": appended, "seconds": round(seconds, 1),
                         "stderr": result.stderr, "stdout": result.stdout})
    import json

    report = json.loads((workdir / "runs" / "prune" / "dino" / "report.json").read_text())
    return {"commands": commands, "prune_report": report, "workdir": str(workdir)}


def markdown(record: dict[str, Any]) -> str:
    report = record["prune_report"]
    lines = ["# The README walkthrough on the full-size DINO ViT-B/16", "",
             f"`python benchmarks/readme_walkthrough.py` on {record['machine']['cpu']} ({record['machine']['cpu_count']} "
             f"cores, {record['machine']['torch_threads']} torch thread(s) per command), {record['machine']['date']}. "
             "Every command of the README's \"Prune your own model\" block, verbatim, with the full-size model "
             f"(`{MODEL}`, random weights from an offline Hugging Face cache, 224 px) and a stand-in for ImageNet "
             "(synthetic images, 2 classes); appended to each, the options that shrink its work.", "",
             "| command | wall time | appended |", "|---|---:|---|"]
    for entry in record["commands"]:
        lines.append(f"| `{entry['command'].split(' --')[0]}` | {entry['seconds']:.0f} s | "
                     f"`{' '.join(entry['appended']) or '-'}` |")
    memory = report.get("peak_memory_mb", {})
    lines += ["", f"The pruning run's stages ({report.get('peak_memory', '')}):", "",
              "| stage | seconds | peak memory (MiB) |", "|---|---:|---:|"]
    names = {"importance": "scoring_s", "search": "search_s", "splits": "splits_s", "export": "export_s"}
    for stage, key in names.items():
        lines.append(f"| {stage} | {report['timings'].get(key, 0):.1f} | {memory.get(stage, 0):,.0f} |")
    lines.append(f"| evaluation (inside export) | {report['timings'].get('evaluation_s', 0):.1f} | |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per command (default 1)")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/readme_walkthrough)")
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import RESULTS, machine_info, parse_args, write_results

    args = parse_args(parser, argv)

    with tempfile.TemporaryDirectory(prefix="walkthrough_") as tmp:
        record = run_walkthrough(Path(tmp), args.threads)
    record["machine"] = {**machine_info(), "torch_threads": args.threads}
    for entry in record["commands"]:
        entry["stderr"] = [line for line in entry["stderr"].splitlines() if line.startswith("[snapvit]")]
        entry.pop("stdout")
    prefix = Path(args.out) if args.out else RESULTS / "readme_walkthrough"
    write_results(prefix, record, markdown, args, round_values=False,
                  subprocesses=True)  # the commands ran in processes of their own: all the project's code counts
    print(f"wrote {prefix}.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
