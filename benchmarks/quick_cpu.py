"""``configs/prune/quick.yaml`` on a full-size model, one CPU thread: how long a first try of a model takes.

    python benchmarks/quick_cpu.py          # ViT-B/16 at 224 px: benchmarks/results/quick_cpu.{json,md}
    python benchmarks/quick_cpu.py --giant  # ViT-g/14 (DINOv2) at 56 px, 4 images: benchmarks/results/giant_cpu.*
    python benchmarks/quick_cpu.py --tiny   # the CI smoke run (a tiny model of the same config)

Runs ``python prune.py --config configs/prune/dino_vitb16.yaml --config configs/prune/quick.yaml`` (the six
default budgets) in a fresh process with one torch thread (``OMP_NUM_THREADS=1``), with random weights
(``--model.pretrained false``: no download) and a stand-in for ImageNet (synthetic JPEGs in its layout, resized to
224 px by the model's transform as real images are). Records the wall time of the whole command (start-up and
imports included), the run's per-stage timings and peak memory (``report.json``) and the machine's load before and
after. ``--giant`` runs the same command on ``vit_giant_patch14_dinov2`` (40 blocks of 24 heads and a 4096-unit SwiGLU
MLP: 164,800 units, 1.1 B parameters) at 56 px on 4 images: every unit of the full-size model is scored and ordered
(the Gram form ``gram: auto`` takes says which and why in the report), in minutes rather than hours on a CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "prune" / "dino_vitb16.yaml"
QUICK = ROOT / "configs" / "prune" / "quick.yaml"
#: The issue's bound: a first try of a full-size model finishes within this on one CPU thread.
LIMIT_S = 300
#: --tiny: the same config on a tiny model of the architecture (32 px, 2 blocks).
TINY = ["--model.model_kwargs={num_classes: 0, img_size: 32, embed_dim: 32, depth: 2, num_heads: 2, "
        "pretrained_cfg_overlay: {input_size: [3, 32, 32]}}", "--export.budgets=[{sparsity: 0.1}, {flops: 0.8}]"]


#: --giant: ViT-g/14 (DINOv2) with every unit of the full-size model, at 56 px (4 x 4 patches) and 4 pruning images.
GIANT = ["--model.model_name=vit_giant_patch14_dinov2", "--model.model_kwargs={img_size: 56, num_classes: 0, "
         "pretrained_cfg_overlay: {input_size: [3, 56, 56]}}", "--data.init_args.max_samples=4",
         "--data.init_args.batch_size=2", "--search.num_images=4", "--search.batch_size=4", "--search.pca_components=4"]


def checkout_of(commit: str, where: Path) -> Path:
    """A checkout of ``commit`` at ``where`` (a git worktree; its ``callbacks/`` linked in as ``snapvit_pl.callbacks``,
    as the installed package lays them out, so that its ``prune.py`` runs its own code)."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), commit], check=True,
                   capture_output=True)
    (where / "snapvit_pl" / "callbacks").symlink_to(where / "callbacks", target_is_directory=True)
    return where


def run_quick(workdir: Path, tiny: bool = False, root: Path = ROOT, giant: bool = False) -> dict[str, Any]:
    """Run the quick configuration in ``workdir`` with the ``prune.py`` of the checkout ``root`` (default this one);
    returns the command, its wall time, the run's report (its stages' timings and peak memory) and the load averages
    around it.

    Raises:
        RuntimeError: the command failed (its status and the end of its error output).
    """
    from benchmarks.readme_walkthrough import stand_in_imagenet

    data = stand_in_imagenet(workdir / "imagenet", train_per_class=32, val=32)  # quick.yaml reads 64 / 32
    command = [sys.executable, str(root / "prune.py"), "--config", str(CONFIG), "--config", str(QUICK),
               "--data.init_args.root", str(data), "--model.pretrained", "false", "--out_dir", str(workdir / "run"),
               "--trainer.accelerator", "cpu", "--progress", "lines", *(TINY if tiny else []), *(GIANT if giant else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           **({"PYTHONPATH": str(root)} if root != ROOT else {})}
    load_before = os.getloadavg()
    started = time.perf_counter()
    result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"quick run failed with status {result.returncode}:\n{result.stderr[-3000:]}")
    report = json.loads((workdir / "run" / "report.json").read_text())
    return {"command": " ".join(Path(a).name if a.startswith(str(ROOT)) else a for a in command[1:]),
            "wall_s": round(seconds, 1), "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()], "timings": report["timings"],
            "models": [report["dense"]] + report["pruned"], "model": report["model"]["model_name"],
            "peak_memory_mb": report.get("peak_memory_mb", {}), "peak_memory": report.get("peak_memory", ""),
            "scorer": report["method"].get("scorer", {}),
            "progress": [line for line in result.stderr.splitlines() if line.startswith("[snapvit]")]}


def markdown(record: dict[str, Any]) -> str:
    machine, run = record["machine"], record["run"]
    timings = run["timings"]
    what = ("a tiny model of the ViT-B/16 config (--tiny)" if record["tiny"] else
            "ViT-g/14 (DINOv2) at 56 px, 4 images (--giant)" if record.get("giant") else "ViT-B/16 at 224 px")
    lines = [f"# configs/prune/quick.yaml on {what}, one CPU thread", "",
             f"`python benchmarks/quick_cpu.py` on {machine['cpu']} ({machine['cpu_count']} cores), 1 torch thread, "
             f"{machine['date']}; load average (1, 5, 15 min) {run['load_before']} before and {run['load_after']} "
             "after: the machine was shared, so this is slower than an idle one.", "",
             f"`python prune.py --config configs/prune/dino_vitb16.yaml --config configs/prune/quick.yaml "
             f"--model.pretrained false` ({what}, random weights, the six default budgets, a stand-in "
             f"for ImageNet): **{run['wall_s'] / 60:.1f} min** wall, start-up included" + (
                 "." if record.get("giant") else
                 f" ({'under' if run['wall_s'] < LIMIT_S else 'OVER'} the {LIMIT_S // 60} min aim)."), "",
             "| stage | seconds |", "|---|---:|"]
    for key in ("scoring_s", "search_s", "splits_s", "export_s", "evaluation_s", "total_s"):
        if timings.get(key) is not None:
            lines.append(f"| {key.removesuffix('_s')} | {timings[key]:.1f} |")
    lines += [f"| the whole command (imports, data, model) | {run['wall_s']:.1f} |"]
    if record.get("giant"):
        lines += ["", "The models it wrote (`models/<label>/`, each rebuilt from timm by `load_pruned`):", "",
                  "| model | params | share of the dense |", "|---|---:|---:|"]
        dense = run["models"][0]["params"]
        lines += [f"| {m.get('label', 'dense')} | {m['params']:,} | {m['params'] / dense:.0%} |" for m in run["models"]]
    before = record.get("before")
    if run.get("peak_memory_mb"):
        lines += ["", f"Peak memory of each stage ({run['peak_memory']}, MiB; the importance pass holds the model, its "
                  f"activations and the scorer's Gram: `gram: {run['scorer'].get('gram_used', '?')}`, "
                  f"{run['scorer'].get('gram_why', '')})" + (f", this commit against `{before['commit']}`'s run of the "
                                                             "same command just before:" if before else ":"), "",
                  "| stage | peak (MiB) |" + (" before (MiB) | before - now (MiB) |" if before else ""),
                  "|---|---:|" + ("---:|---:|" if before else "")]
        for stage, mb in run["peak_memory_mb"].items():
            row = f"| {stage} | {mb:,.0f} |"
            if before and stage in before["peak_memory_mb"]:
                was = before["peak_memory_mb"][stage]
                row += f" {was:,.0f} | {was - mb:,.0f} |"
            lines.append(row)
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the CI smoke run: a tiny model of the same config")
    parser.add_argument("--giant", action="store_true", help="ViT-g/14 at 56 px on 4 images (every full-size unit)")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/quick_cpu[_tiny])")
    parser.add_argument("--before", default=None, metavar="COMMIT",
                        help="also run the same command with the code of COMMIT (a git worktree), first: its peak memory "
                             "per stage beside this commit's")
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import RESULTS, machine_info, parse_args, write_results

    args = parse_args(parser, argv)

    before = None
    if args.before:
        with tempfile.TemporaryDirectory(prefix="quick_cpu_before_") as tmp:
            try:
                root = checkout_of(args.before, Path(tmp) / "checkout")
                (Path(tmp) / "run").mkdir()
                before = {"commit": args.before, **run_quick(Path(tmp) / "run", tiny=args.tiny, root=root,
                                                             giant=args.giant)}
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(Path(tmp) / "checkout")],
                               capture_output=True)
        print(f"before ({args.before}): {before['wall_s']:.0f} s, peak memory {before['peak_memory_mb']}")
    with tempfile.TemporaryDirectory(prefix="quick_cpu_") as tmp:
        run = run_quick(Path(tmp), tiny=args.tiny, giant=args.giant)
    print(f"quick run: {run['wall_s']:.0f} s (1 torch thread; load {run['load_before']} -> {run['load_after']}), "
          f"peak memory {run['peak_memory_mb']}")
    record = {"machine": {**machine_info(), "torch_threads": 1}, "run": run, "tiny": args.tiny, "giant": args.giant,
              "limit_s": LIMIT_S,
              **({"before": before} if before else {})}
    prefix = Path(args.out) if args.out else RESULTS / ("quick_cpu_tiny" if args.tiny else "giant_cpu" if args.giant
                                                        else "quick_cpu")
    write_results(prefix, record, markdown, args, round_values=False,
                  subprocesses=True)  # the commands ran in processes of their own: all the project's code counts
    print(f"wrote {prefix}.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
