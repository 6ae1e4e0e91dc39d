"""The whole prune.py pipeline on full-size ViTs on an accelerator: stage timings, search floor, throughput, memory.

    python benchmarks/gpu_pipeline.py                       # on a GPU: ViT-B/16 (DINO) and ViT-L/14 (DINOv2), 224 px
    python benchmarks/gpu_pipeline.py --tiny                # CPU smoke run (CI): a tiny ViT, a few images

Random weights and synthetic images (the timing does not depend on them): importance over
``--images`` images with 12 multi-crop views (SSL Fisher), the coefficient search (``--evaluations``,
default 50 and 500, one continued run; the search time against the bare forwards of the same
pruned models), extraction of the paper's six pairs, then each pruned model's throughput at batch
1, 64 and 256 in bf16 and fp32 and the peak GPU memory of every stage. Every stage calls the same
pipeline functions prune.py runs (:mod:`snapvit_pl.pipeline`). Writes ``benchmarks/results/gpu_pipeline.json``
(``--tiny``: ``gpu_pipeline_tiny.json``) and a markdown table next to it.
"""
from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, machine_info, rounded  # noqa: E402
from snapvit_pl.data.transforms import BatchMultiCrop  # noqa: E402
from snapvit_pl.device import autocast_context, resolve_device, synchronize  # noqa: E402
from snapvit_pl.elastic import Budget, ElasticScores, paper_budgets  # noqa: E402
from snapvit_pl.eval.throughput import measure_throughput  # noqa: E402
from snapvit_pl.io import write_json_atomic, write_text_atomic  # noqa: E402
from snapvit_pl.models import BackboneSpec, embed, fingerprint, input_shape, load_backbone, prune_  # noqa: E402
from snapvit_pl.pipeline import SearchSettings, extract_models, local_importance, search_snapshots  # noqa: E402
from snapvit_pl.scoring import SSLFisher  # noqa: E402

MODELS = {  # name -> timm architecture at 224 px, random weights
    "vit_b16_dino": BackboneSpec("vit_base_patch16_224.dino", False, None, {"num_classes": 0}),
    "vit_l14_dinov2": BackboneSpec("vit_large_patch14_dinov2.lvd142m", False, None, {"num_classes": 0, "img_size": 224}),
}
TINY = BackboneSpec("vit_small_patch16_224", False, None,
                    {"num_classes": 0, "img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 4})


class Stages:
    """Wall time and peak GPU memory of each stage."""

    def __init__(self, device: torch.device):
        self.device, self.results = device, {}

    def __call__(self, name: str):
        stages = self

        class Stage:
            def __enter__(self):
                synchronize(stages.device)
                if stages.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(stages.device)
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                synchronize(stages.device)
                entry = {"seconds": time.perf_counter() - self.start}
                if stages.device.type == "cuda":
                    entry["peak_memory_gb"] = torch.cuda.max_memory_allocated(stages.device) / 2**30
                stages.results[name] = entry
                print(f"  {name}: {entry['seconds']:.1f} s", flush=True)

        return Stage()


def bare_forwards(model, scores, settings, candidates, images, device) -> float:
    """Seconds of the embedding forwards of the physically pruned models of ``candidates`` (the search's floor);
    each pruned copy is built outside the timer, one at a time."""
    total = 0.0
    for x in candidates:
        for m, h in settings.sparsity_pairs:
            subnet = scores.subnet(Budget(mlp_ratio=m, head_ratio=h), coefficients=settings.to_coefficients(x))[0]
            pruned = prune_(copy.deepcopy(model), subnet)
            synchronize(device)
            start = time.perf_counter()
            with torch.inference_mode(), autocast_context(device):
                for batch in images.split(settings.batch_size):
                    embed(pruned, batch)
            synchronize(device)
            total += time.perf_counter() - start
            del pruned
    return total


def run_model(name: str, spec: BackboneSpec, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    print(f"{name}: {spec.model_name}", flush=True)
    stages = Stages(device)
    torch.manual_seed(0)
    with stages("load"):
        model = load_backbone(spec).to(device).eval()
    shape = input_shape(model)
    plain = torch.randn(args.images, *shape, generator=torch.Generator().manual_seed(0))
    crops = BatchMultiCrop(seed=0)  # 2 global + 10 local views per image, made batch by batch
    batches = (crops(batch).to(device, non_blocking=True) for batch in plain.split(args.scoring_batch))
    with stages("importance"):
        local = local_importance(SSLFisher(), model, batches)
    scores = ElasticScores(local.heads, local.neurons, None, spec.to_dict(), fingerprint(model))
    images = plain[: args.fitness_images].to(device)
    settings = SearchSettings(num_images=args.fitness_images, batch_size=args.fitness_batch,
                              pca_components=args.pca_components)
    first, last = min(args.evaluations), max(args.evaluations)
    evaluated: list[torch.Tensor] = []

    def collect(es, candidates, values) -> None:
        if es.evaluations <= first:
            evaluated.extend(candidates)

    with stages(f"search_{last}"):  # one search, its result recorded at each evaluation count on the way
        snapshots = search_snapshots(model, images, scores, settings, args.evaluations, on_generation=collect)
    short, long = snapshots[first], snapshots[last]
    stages.results[f"search_{first}"] = {"seconds": short.seconds}
    bare = bare_forwards(model, scores, settings, evaluated, images, device)
    search = {
        str(first): {"best_fitness": short.best_fitness, "seconds": short.seconds, "forward_s": short.forward_s},
        str(last): {"best_fitness": long.best_fitness, "seconds": long.seconds},
        "floor": {"search_s": short.seconds, "bare_forward_s": bare, "ratio": short.seconds / bare,
                  "note": "search time (initial fitness and PCA included) / bare forwards of the same pruned models"},
    }
    scores.coefficients = long.coefficients
    with stages("extraction"):
        items = extract_models(model, scores, paper_budgets(), keep_models=True)
    throughput = []
    for item in [None, *items]:
        pruned = model if item is None else item.model
        row = {"model": "dense" if item is None else item.label, "params": sum(p.numel() for p in pruned.parameters())}
        for precision in ("bf16", "32"):
            for batch in args.throughput_batches:
                measured = measure_throughput(pruned, shape, batch, warmup=args.warmup, repeats=args.repeats,
                                              device=device, precision=precision)
                row[f"{precision}_b{batch}_images_per_s"] = measured.images_per_second
                if measured.peak_memory_bytes is not None:
                    row[f"{precision}_b{batch}_peak_memory_gb"] = measured.peak_memory_bytes / 2**30
        throughput.append(row)
    return {"spec": spec.to_dict(), "stages": stages.results, "search": search, "throughput": throughput,
            "elastic_scores_s": stages.results["importance"]["seconds"] + stages.results[f"search_{first}"]["seconds"]}


def markdown(report: dict[str, Any]) -> str:
    lines = ["# The pipeline on an accelerator", "",
             f"`python benchmarks/gpu_pipeline.py{' --tiny' if report['tiny'] else ''}` on {report['device']} "
             f"({report['machine']['date']}); random weights, synthetic images, {report['settings']['images']} "
             f"images x 12 views for the importance, {report['settings']['fitness_images']} fitness images.", ""]
    for name, entry in report["models"].items():
        stages = ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in entry["stages"].items())
        lines += [f"## {name}", "", f"- stages: {stages}; elastic scores (importance + the shorter search) "
                  f"{entry['elastic_scores_s']:.1f} s",
                  "- search: " + ", ".join(f"{k} evaluations: fitness {v['best_fitness']:.4f} in {v['seconds']:.1f} s"
                                           for k, v in entry["search"].items() if k != "floor"),
                  f"- search floor: {entry['search']['floor']['search_s']:.1f} s against "
                  f"{entry['search']['floor']['bare_forward_s']:.1f} s of bare pruned forwards "
                  f"(ratio {entry['search']['floor']['ratio']:.2f})", ""]
        keys = [k for k in entry["throughput"][0] if k.endswith("images_per_s")]
        lines += ["| model | params | " + " | ".join(k.removesuffix("_images_per_s") for k in keys) + " |",
                  "|---|---:|" + "---:|" * len(keys)]
        lines += [f"| {row['model']} | {row['params'] / 1e6:.1f}M | " + " | ".join(f"{row[k]:.0f}" for k in keys) + " |"
                  for row in entry["throughput"]]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: a tiny ViT and a few images")
    parser.add_argument("--models", default=",".join(MODELS), help=f"subset of {','.join(MODELS)}")
    parser.add_argument("--images", type=int, default=1000, help="importance images (12 views each)")
    parser.add_argument("--evaluations", default="50,500", help="search evaluation counts (one continued run)")
    parser.add_argument("--device", default=None, help="default: CUDA if available")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/gpu_pipeline[_tiny])")
    args = parser.parse_args(argv)
    args.evaluations = [int(e) for e in args.evaluations.split(",")]
    args.scoring_batch, args.fitness_images, args.fitness_batch, args.pca_components = 16, 1000, 250, 192
    args.throughput_batches, args.warmup, args.repeats = [1, 64, 256], 5, 20
    specs = {name: MODELS[name] for name in args.models.split(",")}
    if args.tiny:
        specs = {"tiny": TINY}
        args.images, args.evaluations, args.fitness_images, args.fitness_batch = 32, [4, 8], 32, 32
        args.pca_components, args.throughput_batches, args.warmup, args.repeats = 8, [1, 8], 1, 2
    device = resolve_device("cpu" if args.tiny and args.device is None else args.device)
    if device.type != "cuda" and not args.tiny:
        print("warning: no GPU: the full-size run on CPU takes hours; use --tiny for a smoke run", file=sys.stderr)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    report: dict[str, Any] = {"benchmark": "benchmarks/gpu_pipeline.py", "tiny": args.tiny, "device": f"{device} ({name})",
                              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "device")},
                              "models": {}}
    started = time.perf_counter()
    for model_name, spec in specs.items():
        report["models"][model_name] = run_model(model_name, spec, args, device)
    report["total_s"] = time.perf_counter() - started
    report["machine"] = machine_info()
    prefix = Path(args.out) if args.out else RESULTS / ("gpu_pipeline_tiny" if args.tiny else "gpu_pipeline")
    write_json_atomic(prefix.with_suffix(".json"), rounded(report))
    write_text_atomic(prefix.with_suffix(".md"), markdown(rounded(report)))
    print(f"wrote {prefix}.json/.md ({report['total_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
