"""What the Gauss-Newton greedy costs at full size: ViT-B/16 (random weights, synthetic images), one CPU thread.

Each scorer runs in a fresh process (so that its peak resident memory is its own): the importance pass over
``--images`` images in batches of 16 (the presets' batch size), then ``compute()`` (for the greedy: the removal
order of every unit), timed apart. The per-image figure is the pass's; the order is paid once per run, and is
reported also as its share of a 1000-image run (``configs/prune/dino_vitb16.yaml``'s size).

    OMP_NUM_THREADS=1 python benchmarks/gn_cost.py            # -> benchmarks/results/gn_cost.{json,md}
    OMP_NUM_THREADS=1 python benchmarks/gn_cost.py --tiny     # smoke run on a small ViT (no results file)
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, machine_info, parse_args, write_results  # noqa: E402
from snapvit_pl.models import BackboneSpec, load_backbone, prunable_blocks  # noqa: E402
from snapvit_pl.models.cost import input_shape  # noqa: E402
from snapvit_pl.pipeline import local_importance  # noqa: E402
from snapvit_pl.scoring import GaussNewtonGreedy, OutputSensitivity  # noqa: E402
from snapvit_pl.scoring.gram import full_gram_bytes  # noqa: E402

VIT_B = BackboneSpec("vit_base_patch16_224.dino", False, None, {"num_classes": 0})
TINY = BackboneSpec("vit_small_patch16_224", False, None,
                    {"num_classes": 0, "img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 4})
#: scorer name -> (constructor, what it is)
SCORERS = {
    "sensitivity": (lambda: OutputSensitivity(probes=4), "OutputSensitivity, 4 probes (the default before issue 38)"),
    "gn_full": (lambda: GaussNewtonGreedy(probes=4, gram="full"), "GaussNewtonGreedy, exact full Gram"),
    "gn_lowrank": (lambda: GaussNewtonGreedy(probes=4, gram="lowrank"), "GaussNewtonGreedy, block Grams + rank-512 "
                                                                        "Nystrom cross-block terms"),
    "gn_block": (lambda: GaussNewtonGreedy(probes=4, gram="block"), "GaussNewtonGreedy, block-diagonal Gram"),
    "gn_full_stages3": (lambda: GaussNewtonGreedy(probes=4, gram="full", stages=3),
                        "GaussNewtonGreedy, exact full Gram, re-linearised in 3 stages (3 passes)"),
}
BATCH = 16
RUN_IMAGES = 1000


def one(name: str, images: int, tiny: bool) -> dict[str, Any]:
    """Run scorer ``name`` in this process; returns its times and peak memory."""
    torch.manual_seed(0)
    model = load_backbone(TINY if tiny else VIT_B).eval()
    shape = input_shape(model)
    data = torch.randn(images, *shape, generator=torch.Generator().manual_seed(0))
    scorer = SCORERS[name][0]().bind(model)
    pass_s = compute_s = 0.0
    for done in range(1, scorer.passes + 1):  # the importance passes (one per stage), and the order of each stage
        cpu = time.process_time()
        for batch in data.split(BATCH):
            scorer.update(batch)
        scorer.reduce(lambda t: t)
        pass_s += time.process_time() - cpu
        cpu = time.process_time()
        scorer.next_pass() if done < scorer.passes else scorer.compute()
        compute_s += time.process_time() - cpu
    blocks = prunable_blocks(model)
    sizes = [b.heads.num_units + b.neurons.num_units for b in blocks]
    return {"scorer": name, "model": (TINY if tiny else VIT_B).model_name, "blocks": len(blocks),
            "heads": blocks[0].heads.num_units, "neurons": blocks[0].neurons.num_units, "images": images, "pass_s": pass_s, "pass_s_per_image": pass_s / images,
            "compute_s": compute_s, "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20,
            "units": sum(sizes), "full_gram_gib": full_gram_bytes(sizes) / 2 ** 30,
            "resolved": list(getattr(scorer, "resolved", None) or ["-", "-"])}


def markdown(report: dict[str, Any]) -> str:
    rows = report["rows"]
    base = next(r for r in rows if r["scorer"] == "sensitivity")["pass_s_per_image"]
    m = report["machine"]
    lines = [
        "# The Gauss-Newton greedy at full size: ViT-B/16 on one CPU thread", "",
        f"`python benchmarks/gn_cost.py`, {m['date']}, {m['cpu']}, {m['torch_threads']} torch thread, torch "
        f"{m['torch']}, load average {m['load_average_1m_at_end']:.1f} at the end (other jobs on this 2-core machine "
        "slow every row alike). "
        f"`{rows[0]['model']}` with random weights ({rows[0]['units']:,} units: {rows[0]['blocks']} "
        f"blocks of {rows[0]['heads']} heads and {rows[0]['neurons']} MLP neurons), {rows[0]['images']} synthetic images in batches of {BATCH}, 4 probes each; every scorer in a fresh "
        "process. *Pass*: the importance pass (CPU seconds per image); *order*: `compute()` once at the end (the "
        f"greedy's removal order); *per image at {RUN_IMAGES}*: the pass plus the order spread over a "
        f"{RUN_IMAGES}-image run; *peak*: the process's peak resident memory (model, activations, accumulators).", "",
        "| scorer | pass (s / image) | x default | order (s) | per image at 1000 | x default | peak (GiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        at_run = r["pass_s_per_image"] + r["compute_s"] / RUN_IMAGES
        lines.append(f"| {SCORERS[r['scorer']][1]} | {r['pass_s_per_image']:.2f} | {r['pass_s_per_image'] / base:.2f} | "
                     f"{r['compute_s']:.1f} | {at_run:.2f} | {at_run / base:.2f} | {r['peak_rss_gib']:.2f} |")
    lines += ["", f"The full Gram's upper block triangle holds {rows[0]['full_gram_gib']:.2f} GiB in fp32 (half of the "
              f"{2 * rows[0]['full_gram_gib']:.2f} GiB a square matrix would take); `gram: auto` keeps it on a CPU up "
              "to 4 GiB (and half the memory free) and on an accelerator up to half its free memory, else takes the low-rank form."]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--scorers", default=",".join(SCORERS))
    parser.add_argument("--tiny", action="store_true", help="a small ViT and 4 images; no results file")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process: one scorer, JSON out
    args = parse_args(parser, argv)
    images = 4 if args.tiny else args.images
    if args.one:
        torch.set_num_threads(1)
        print(json.dumps(one(args.one, images, args.tiny)))
        return 0
    rows = []
    for name in args.scorers.split(","):
        command = [sys.executable, __file__, "--one", name, "--images", str(images), *(["--tiny"] if args.tiny else [])]
        done = subprocess.run(command, capture_output=True, text=True, check=True,
                              env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{name}: {rows[-1]['pass_s_per_image']:.2f} s per image, order {rows[-1]['compute_s']:.1f} s, "
              f"peak {rows[-1]['peak_rss_gib']:.2f} GiB", flush=True)
    report = {"rows": rows, "machine": {**machine_info(), "torch_threads": 1}}
    if args.tiny:
        print(markdown(report))
        return 0
    write_results(RESULTS / "gn_cost", report, markdown, args,
                  subprocesses=True)  # each measurement ran in a process of its own
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
