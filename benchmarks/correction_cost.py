"""What correcting one pruned model costs: seconds and peak memory of each correction method.

    python benchmarks/correction_cost.py                  # ViT-B/16 and ViT-L/14 at 224 px, 8 calibration images
    python benchmarks/correction_cost.py --images 8,32    # how the cost grows with the calibration images
    python benchmarks/correction_cost.py --models clutter,dino,vit_b16 --methods dense_fit,default --images 1000
                                                          # the default correction against the fit alone (issue 75)
    python benchmarks/correction_cost.py --tiny           # the CI smoke run (a tiny model)

``--methods``: ``sparsegpt`` and ``dense_fit`` are each method alone (nothing held out, no reconstruction steps);
``default`` is what ``--correction.enabled true`` runs on this device with every other setting at its default;
``checked`` the fit judged on a fifth of the images held out (``--correction.held_out 0.2``: each block's choice and
the output check), ``steps`` that with up to 1000 reconstruction steps per pruned block (what an accelerator runs). ``--models`` takes the
full-size names below and the development models (their architecture, random weights: the cost does not depend on
them).

Random weights (no download), synthetic calibration images, one torch thread, the CPU. Each (model, method, images)
runs in a fresh process, ``--rounds`` times (the methods alternating; the median is reported), so that its peak
resident memory (:class:`snapvit_pl.device.PeakMemory`, reset when the correction starts) is its own. The
sub-network keeps 50% of the heads and 35% of the MLP neurons of every block (about 41% of the parameters; which units
are kept does not change the cost). Each method is what ``prune.py`` runs for ``--correction.method``
(:class:`snapvit_pl.pipeline.extraction.Correction`, a copy of the base model included). 8 calibration images is
what ``configs/prune/quick.yaml`` gives the correction (its whole pruning set), the setting ``issue 55`` compares
with the importance stage of that config (``quick_cpu.md``)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, machine_info, parse_args, write_results  # noqa: E402

MODELS = {"vit_b16": "vit_base_patch16_224", "vit_l14": "vit_large_patch14_224"}
TINY = {"tiny": "vit_tiny_patch16_224"}
#: Each ``--methods`` word: the correction settings besides the calibration images (``default``: every default).
VARIANTS = {"sparsegpt": {"method": "sparsegpt", "held_out": 0.0},
            "dense_fit": {"method": "dense_fit", "held_out": 0.0, "reconstruct_steps": 0},
            "default": {},
            # issue 75: the fit judged on a fifth of the images held out (each block's choice, the output check)...
            "checked": {"method": "dense_fit", "held_out": 0.2, "reconstruct_steps": 0},
            # ... and with up to 1000 reconstruction steps per pruned block (patience 200), as an accelerator runs
            "steps": {"method": "dense_fit", "held_out": 0.2, "reconstruct_steps": 1000}}
#: What ``--methods`` measures unless told.
METHODS = ("sparsegpt", "dense_fit", "default")
KEEP_HEADS, KEEP_NEURONS = 0.5, 0.35


def measure_one(model_name: str, method: str, images: int, tiny: bool) -> dict[str, Any]:
    """Correct one pruned copy of ``model_name`` with ``method`` on ``images`` calibration images (this process)."""
    import torch

    from benchmarks.common import MODELS as DEVELOPMENT
    from snapvit_pl.correction import CorrectionSettings
    from snapvit_pl.device import PeakMemory
    from snapvit_pl.models import BackboneSpec, Subnet, load_backbone, prunable_blocks
    from snapvit_pl.pipeline.extraction import Correction

    torch.set_num_threads(1)
    if model_name in DEVELOPMENT:  # its architecture (random weights)
        base = json.loads((DEVELOPMENT[model_name] / "architecture.json").read_text())["base"]
        spec = BackboneSpec(base["model_name"], False, None, base["model_kwargs"])
    else:
        spec = BackboneSpec(model_name, False, None, {"num_classes": 0, **({"img_size": 32, "depth": 2} if tiny else {})})
    model = load_backbone(spec).eval()
    size = model.patch_embed.img_size
    calibration = torch.randn(images, model.patch_embed.proj.in_channels, *size,
                              generator=torch.Generator().manual_seed(0))
    blocks = prunable_blocks(model)
    subnet = Subnet([torch.arange(round(b.heads.num_units * KEEP_HEADS)) for b in blocks],
                    [torch.arange(round(b.neurons.num_units * KEEP_NEURONS)) for b in blocks])
    settings = CorrectionSettings(enabled=True, num_samples=images, batch_size=min(images, 64 if images > 8 else 8),
                                  **VARIANTS[method])
    memory = PeakMemory("cpu")
    before = memory.start().peak_mb()
    started = time.perf_counter()
    corrected, record = Correction(settings, calibration)(model, subnet)
    seconds = time.perf_counter() - started
    params = sum(p.numel() for p in corrected.parameters())
    return {"model": model_name, "method": method, "images": images, "seconds": seconds,
            "held_out_images": record["held_out_images"], "kept": record["kept"],
            "reconstruction_steps": sum(b["steps_run"] for b in record.get("reconstruction", {}).get("blocks", [])),
            "peak_mb": memory.peak_mb(), "held_before_mb": before, "kept_params": params,
            "dense_params": sum(p.numel() for p in model.parameters())}


def markdown(report: dict[str, Any]) -> str:
    rows = report["rows"]
    lines = ["# The correction's cost on one pruned model (CPU, one thread)", "",
             f"Random weights, synthetic calibration images, {report['machine']['cpu_count']}-core machine, "
             f"torch {report['machine']['torch']}, one torch thread, load average at the end "
             f"{report['machine']['load_average_1m_at_end']}. The sub-network keeps {KEEP_HEADS:.0%} of the heads "
             f"and {KEEP_NEURONS:.0%} of the MLP neurons of every block. Peak memory: the process's peak resident "
             "set size during the correction (the model, its copy and the calibration streams); 'held before': "
             "what the process held when it started (the model and the images).", "",
             "| model | kept params | method | calibration images | held out | seconds | rounds | x the fit alone "
             "| peak (MiB) | held before (MiB) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    fit = {(r["model"], r["images"]): r["seconds"] for r in rows if r["method"] == "dense_fit"}
    for r in rows:
        alone = fit.get((r["model"], r["images"]))
        ratio = f"{r['seconds'] / alone:.2f}" if alone else "-"
        lines.append(f"| {r['model']} | {r['kept_params'] / r['dense_params']:.0%} | {r['method']} | {r['images']} | "
                     f"{r.get('held_out_images', 0)} | {r['seconds']:.1f} | {len(r.get('rounds', [0]))} | {ratio} | "
                     f"{r['peak_mb']:.0f} | "
                     f"{r['held_before_mb']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", default="8", help="comma-separated calibration image counts")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated subset of {', '.join(VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=1, help="measurements of each (model, method), median kept")
    parser.add_argument("--full-size-rounds", type=int, default=1, help="the same for the full-size models")
    parser.add_argument("--tiny", action="store_true", help="smoke run: a tiny model, 2 images")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: model,method,images
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/correction_cost)")
    args = parse_args(parser, argv)
    if args.one:
        name, method, images = args.one.split(",")
        print(json.dumps(measure_one(name, method, int(images), args.tiny)))
        return 0
    models = TINY if args.tiny else {k: MODELS.get(k, k) for k in args.models.split(",")}
    counts = [2] if args.tiny else [int(n) for n in args.images.split(",")]
    rows = []
    for label, name in models.items():
        rounds = args.full_size_rounds if label in MODELS else args.rounds
        for images in counts:
            # rounds alternate the methods (paired: a busy moment slows one round of each); the median is reported
            measured: dict[str, list[dict[str, Any]]] = {method: [] for method in args.methods.split(",")}
            for _ in range(rounds):
                for method in measured:
                    done = subprocess.run([sys.executable, __file__, "--one", f"{name},{method},{images}",
                                           *(["--tiny"] if args.tiny else [])], capture_output=True, text=True,
                                          env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)
                    measured[method].append(json.loads(done.stdout.strip().splitlines()[-1]))
            for method, runs in measured.items():
                seconds = sorted(r["seconds"] for r in runs)
                row = {**runs[0], "model": label, "seconds": statistics.median(seconds), "rounds": seconds,
                       "peak_mb": max(r["peak_mb"] for r in runs)}
                print(f"{label} {method} {images} images: {row['seconds']:.1f} s (median of {len(runs)}), "
                      f"peak {row['peak_mb']:.0f} MiB", flush=True)
                rows.append(row)
    out = Path(args.out) if args.out else RESULTS / ("correction_cost_tiny" if args.tiny else "correction_cost")
    write_results(out, {"rows": rows, "machine": machine_info()}, markdown, args,
                  subprocesses=True)  # each measurement ran in a process of its own
    return 0


if __name__ == "__main__":
    sys.exit(main())
