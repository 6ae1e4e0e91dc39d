"""The whole pruning pipeline on full-size ViTs: each stage's time and peak memory, the cost per image, the search
against its floor, the pruned models' throughput, every stage against its floor (``stage_floors.py``).

    python benchmarks/gpu_pipeline.py                       # on a GPU: ViT-B/16 (DINO) and ViT-L/14 (DINOv2), 224 px
    python benchmarks/gpu_pipeline.py --cpu                 # ViT-B/16 on the CPU with the image counts scaled down
    python benchmarks/gpu_pipeline.py --tiny                # CPU smoke run (CI): a tiny ViT, a few images

Random weights and synthetic images (the timing does not depend on them). Every stage runs through the driver
``prune.py`` runs (:class:`snapvit_pl.pipeline.Pipeline`: importance over ``--images`` images with the default
scorer (``--scorer``; the Gauss-Newton greedy: one forward and 4 probe backward passes per image and the Gram of
the mask gradients; SSL-Fisher: 12 multi-crop views per image), the optional coefficient search (the shorter of ``--evaluations``; the default run
has none, SnapViT's SSL-Fisher needs it), the head/MLP splits of the default grid and a FLOPs budget, the export
of the paper's six pairs), so stage times and peak memory (CUDA max
allocated on a GPU, process peak RSS on CPU) are what a run records in report.json. Then: the search continued
to the longer evaluation count (one continued run), its time against the bare forwards of the same pruned models
(the search's floor), and each pruned model's throughput at several batch sizes in bf16 and fp32. The cost per
image of each stage, and what it comes to at the configs' image counts (1000 images, 50 evaluations of 1000
fitness images, 256 calibration images), are in the record; the split choice is scaled in images only (this run's
budgets, grid and candidates: ``stage_floors.py`` estimates it at the config's grid). Writes ``benchmarks/results/gpu_pipeline.json`` (``--cpu``: ``full_size_cpu``,
``--tiny``: ``gpu_pipeline_tiny``) and a markdown table next to it.
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

from benchmarks import stage_floors  # noqa: E402
from benchmarks.common import RESULTS, machine_info, parse_args, write_results  # noqa: E402
from snapvit_pl.data.transforms import BatchMultiCrop  # noqa: E402
from snapvit_pl.device import autocast_context, resolve_device, synchronize  # noqa: E402
from snapvit_pl.elastic import PAPER_PAIRS, Budget  # noqa: E402
from snapvit_pl.eval import EvaluationSettings  # noqa: E402
from snapvit_pl.eval.throughput import measure_throughput  # noqa: E402
from snapvit_pl.models import BackboneSpec, embed, input_shape, load_backbone, prune_  # noqa: E402
from snapvit_pl.pipeline import (  # noqa: E402
    Correction, CorrectionSettings, ExportSettings, ImportanceSettings, Pipeline, PipelineSettings, SearchSettings, TensorInputs, scoring_views,
    search_snapshots,
)
from snapvit_pl.scoring import build_scorer  # noqa: E402

MODELS = {  # name -> timm architecture at 224 px, random weights
    "vit_b16_dino": BackboneSpec("vit_base_patch16_224.dino", False, None, {"num_classes": 0}),
    "vit_l14_dinov2": BackboneSpec("vit_large_patch14_dinov2.lvd142m", False, None, {"num_classes": 0, "img_size": 224}),
}
TINY = BackboneSpec("vit_small_patch16_224", False, None,
                    {"num_classes": 0, "img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 4})
#: The sizes of a real run (configs/prune/dino_vitb16.yaml): the per-image costs are scaled to these.
CONFIG_SIZES = {"images": 1000, "evaluations": 50, "fitness_images": 1000, "calibration": 256}
STAGES = ("importance", "search", "splits", "export")


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


def run_model(spec: BackboneSpec, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    print(f"{spec.model_name} on {device}", flush=True)
    torch.manual_seed(0)
    started = time.perf_counter()
    model = load_backbone(spec).to(device).eval()
    load_s = time.perf_counter() - started
    shape = input_shape(model)
    plain = torch.randn(args.images, *shape, generator=torch.Generator().manual_seed(0))
    first, last = min(args.evaluations), max(args.evaluations)
    search = SearchSettings(max_evaluations=first, popsize=args.popsize, num_images=args.fitness_images,
                            batch_size=args.fitness_batch, pca_components=args.pca_components)
    importance = ImportanceSettings(build_scorer(args.scorer) if args.scorer else None)
    settings = PipelineSettings(importance=importance, search=search, evaluation=EvaluationSettings(metrics=[]), export=ExportSettings(
        budgets=[{"flops": 0.5}] + [{"mlp_ratio": m, "head_ratio": h} for m, h in PAPER_PAIRS],
        split_grid=args.split_grid, split_candidates=args.split_candidates, save_models=False))
    fitness = torch.randn(args.fitness_images, *shape, generator=torch.Generator().manual_seed(1))
    pipeline = Pipeline(model, settings, spec=spec, inputs=TensorInputs(fitness), progress="lines")
    views = scoring_views(importance.scorer)
    crops = BatchMultiCrop(seed=0) if views == "multicrop" else (lambda batch: batch)  # 2 global + 10 local views
    if views == "labeled":
        raise SystemExit("error: the benchmark has no labels; choose a label-free --scorer")
    pipeline.importance(crops(batch).to(device, non_blocking=True) for batch in plain.split(args.scoring_batch))
    pipeline.search()
    pipeline.choose_splits()
    items = pipeline.export()
    state = pipeline.state
    seconds = {"load": load_s, "importance": state.timings.scoring_s, "search": state.timings.search_s,
               "splits": state.timings.splits_s, "export": state.timings.export_s}
    splits = len(state.splits) * args.split_candidates  # fitness distances of the split choice (about)
    per_image = {
        "importance_s_per_image": seconds["importance"] / args.images,
        "search_s_per_evaluation_per_fitness_image": seconds["search"] / (first * args.fitness_images),
        "splits_s_per_candidate_per_fitness_image": seconds["splits"] / max(1, splits * args.fitness_images),
    }
    at_config = {
        "importance_s": per_image["importance_s_per_image"] * CONFIG_SIZES["images"],
        "search_s": per_image["search_s_per_evaluation_per_fitness_image"] * CONFIG_SIZES["evaluations"]
        * CONFIG_SIZES["fitness_images"],
        "splits_s": per_image["splits_s_per_candidate_per_fitness_image"] * splits * CONFIG_SIZES["fitness_images"],
    }
    # the weight correction of the FLOPs-budget model (what --correction.enabled true adds to each model)
    calibration = torch.randn(args.calibration_images, *shape, generator=torch.Generator().manual_seed(2))
    correct = Correction(CorrectionSettings(enabled=True, num_samples=args.calibration_images), calibration.to(device))
    synchronize(device)
    started = time.perf_counter()
    correct(model, items[0].subnet)
    synchronize(device)
    seconds["correction_one_model"] = time.perf_counter() - started
    per_image["correction_s_per_calibration_image"] = seconds["correction_one_model"] / args.calibration_images
    at_config["correction_s_per_model"] = per_image["correction_s_per_calibration_image"] * CONFIG_SIZES["calibration"]
    # the search continued to the longer count, and the first count's candidates replayed as bare forwards
    images = fitness.to(device)
    evaluated: list[torch.Tensor] = []

    def collect(es, candidates, values) -> None:
        if es.evaluations <= first:
            evaluated.extend(candidates)

    local = replace(pipeline.elastic_scores(), coefficients=None)
    snapshots = search_snapshots(model, images, local, replace(search, max_evaluations=last), args.evaluations,
                                 on_generation=collect)
    short, long = snapshots[first], snapshots[last]
    bare = bare_forwards(model, local, search, evaluated, images, device)
    throughput = []
    for item in [None, *items]:
        pruned = model if item is None else prune_(copy.deepcopy(model), item.subnet)
        row = {"model": "dense" if item is None else item.label, "params": sum(p.numel() for p in pruned.parameters())}
        for precision in args.precisions:
            for batch in args.throughput_batches:
                measured = measure_throughput(pruned, shape, batch, warmup=args.warmup, repeats=args.repeats,
                                              device=device, precision=precision)
                row[f"{precision}_b{batch}_images_per_s"] = measured.images_per_second
        throughput.append(row)
    return {
        "spec": spec.to_dict(), "scorer": importance.scorer_record(), "importance_views": views, "seconds": seconds, "peak_memory_mb": state.peak_memory_mb, "memory": state.memory_kind,
        "per_image": per_image, "at_config_sizes": at_config, "splits_chosen": len(state.splits),
        "search": {str(first): {"best_fitness": short.best_fitness, "seconds": short.seconds},
                   str(last): {"best_fitness": long.best_fitness, "seconds": long.seconds},
                   "floor": {"search_s": short.seconds, "bare_forward_s": bare, "ratio": short.seconds / bare,
                             "note": "search time (initial fitness and PCA included) / bare forwards of the same "
                                     "pruned models"}},
        "throughput": throughput,
    }


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = ["# The pipeline on full-size models", "",
             f"`python benchmarks/gpu_pipeline.py{' --tiny' if report['tiny'] else ' --cpu' if report['cpu'] else ''}` "
             f"on {report['device']}, {report['machine']['date']}, {report['machine']['torch_threads']} torch "
             f"thread(s); random weights, synthetic images: {s['images']} images for the importance, "
             f"{s['fitness_images']} fitness images, {min(s['evaluations'])} search evaluations in the pipeline "
             f"(continued to {max(s['evaluations'])}), the split grid every {s['split_grid']:.0%} with "
             f"{s['split_candidates']} candidates.", ""]
    if report.get("partial"):
        lines += ["**Unfinished run: the models finished so far.**", ""]
    for name, entry in report["models"].items():
        lines += [f"## {name} (`{entry['spec']['model_name']}`), scorer `{entry['scorer']['name']}`", "",
                  f"| stage | seconds | peak memory (MiB, {entry['memory']}) | per image | at the config's image counts |",
                  "|---|---:|---:|---|---:|"]
        per, at = entry["per_image"], entry["at_config_sizes"]
        views = "12 views" if entry["importance_views"] == "multicrop" else "plain"
        notes = {"importance": (f"{per['importance_s_per_image']:.3g} s per image ({entry['scorer']['name']}, {views})",
                                at["importance_s"]),
                 "search": (f"{per['search_s_per_evaluation_per_fitness_image'] * 1000:.3g} s per evaluation of 1000 "
                            "images (optional: the default run has no search)", at["search_s"]),
                 "splits": (f"{entry['splits_chosen']} budgets x {s['split_candidates']} candidate splits (this run's "
                            "grid and candidates, scaled to 1000 fitness images; not the config's grid)", at["splits_s"]),
                 "correction_one_model": (f"{per['correction_s_per_calibration_image']:.3g} s per calibration image "
                                          "(optional, per model)", at["correction_s_per_model"])}
        for stage in ("load", *STAGES, "correction_one_model"):
            note, total = notes.get(stage, ("", None))
            memory = entry["peak_memory_mb"].get(stage)
            lines.append(f"| {stage} | {entry['seconds'][stage]:.1f} | {'' if memory is None else f'{memory:,.0f}'} | "
                         f"{note} | {'' if total is None else f'{total:,.0f} s'} |")
        floor = entry["search"]["floor"]
        lines += ["", "- search: " + ", ".join(f"{k} evaluations: fitness {v['best_fitness']:.4f} in {v['seconds']:.1f} s"
                                               for k, v in entry["search"].items() if k != "floor"),
                  f"- search floor: {floor['search_s']:.1f} s against {floor['bare_forward_s']:.1f} s of bare pruned "
                  f"forwards (ratio {floor['ratio']:.2f})", ""]
        keys = [k for k in entry["throughput"][0] if k.endswith("images_per_s")]
        lines += ["| model | params | " + " | ".join(k.removesuffix("_images_per_s") for k in keys) + " |",
                  "|---|---:|" + "---:|" * len(keys)]
        lines += [f"| {row['model']} | {row['params'] / 1e6:.1f}M | " + " | ".join(f"{row[k]:.0f}" for k in keys) + " |"
                  for row in entry["throughput"]]
        lines += ["", "| stage | seconds | floor (s) | stage / floor | the floor (`stage_floors.py`) |", "|---|---:|---:|---:|---|"]
        lines += [f"| {stage} | {r['seconds']:.2f} | {r['floor_s']:.2f} | {r['ratio']:.2f} | {r['floor']} |"
                  for stage, r in entry["floors"]["stages"].items()]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: a tiny ViT and a few images")
    parser.add_argument("--cpu", action="store_true", help="ViT-B/16 on the CPU, image counts scaled down")
    parser.add_argument("--models", default=",".join(MODELS), help=f"subset of {','.join(MODELS)}")
    parser.add_argument("--images", type=int, default=1000, help="importance images")
    parser.add_argument("--scorer", default=None, help="a label-free scorer name (default: the pipeline's)")
    parser.add_argument("--evaluations", default="50,500", help="search evaluation counts (one continued run)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    parser.add_argument("--device", default=None, help="default: CUDA if available")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/gpu_pipeline[_tiny])")
    args = parse_args(parser, argv)
    args.evaluations = [int(e) for e in args.evaluations.split(",")]
    args.scoring_batch, args.fitness_images, args.fitness_batch, args.pca_components = 16, 1000, 250, 192
    args.calibration_images = 256
    args.popsize, args.split_grid, args.split_candidates = 8, 0.1, 7
    args.throughput_batches, args.warmup, args.repeats, args.precisions = [1, 64, 256], 5, 20, ("bf16", "32")
    specs = {name: MODELS[name] for name in args.models.split(",")}
    if args.tiny:
        specs = {"tiny": TINY}
        args.images, args.evaluations, args.fitness_images, args.fitness_batch = 32, [4, 8], 32, 32
        args.pca_components, args.throughput_batches, args.warmup, args.repeats = 8, [1, 8], 1, 2
        args.popsize, args.split_grid, args.split_candidates, args.calibration_images = 4, 0.5, 2, 8
    elif args.cpu:  # scaled down: the per-image costs are what matter
        specs = {"vit_b16_dino": MODELS["vit_b16_dino"]}
        args.images, args.evaluations, args.fitness_images, args.fitness_batch = 8, [4, 8], 16, 16
        args.pca_components, args.throughput_batches, args.warmup, args.repeats = 16, [1, 16], 1, 3
        args.popsize, args.split_grid, args.split_candidates, args.precisions = 4, 0.25, 3, ("32",)  # CPU bf16 is slow
        args.calibration_images = 16
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device("cpu" if (args.tiny or args.cpu) and args.device is None else args.device)
    if device.type != "cuda" and not (args.tiny or args.cpu):
        print("warning: no GPU: the full-size run on CPU takes hours; use --cpu (scaled down) or --tiny", file=sys.stderr)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    report: dict[str, Any] = {"benchmark": "benchmarks/gpu_pipeline.py", "tiny": args.tiny, "cpu": args.cpu,
                              "device": f"{device} ({name})",
                              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "device")},
                              "models": {}}
    started = time.perf_counter()
    floors = argparse.Namespace(images=min(args.images, 64), fitness_images=min(args.fitness_images, 256),
                                split_grid=args.split_grid, split_candidates=args.split_candidates)
    default = "gpu_pipeline_tiny" if args.tiny else "full_size_cpu" if args.cpu else "gpu_pipeline"
    prefix = Path(args.out) if args.out else RESULTS / default
    for model_name, spec in specs.items():
        report["models"][model_name] = run_model(spec, args, device)
        # every stage against its floor, as benchmarks/stage_floors.py measures it (here on this device)
        report["models"][model_name]["floors"] = stage_floors.full_size(spec, floors, stage_floors.Clock(device),
                                                                        lambda message: print(message, flush=True))
        # written after every model: a run cut short (a lease that ends) keeps the models it finished
        report["total_s"] = time.perf_counter() - started
        report["machine"] = machine_info()
        report["partial"] = len(report["models"]) < len(specs)
        write_results(prefix, report, markdown, args)
        print(f"wrote {prefix}.json/.md ({len(report['models'])} of {len(specs)} models, {report['total_s']:.0f} s)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
