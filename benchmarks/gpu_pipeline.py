"""The whole pruning pipeline on full-size ViTs, most important numbers first, within a wall-time budget.

    python benchmarks/gpu_pipeline.py --budget-s 600        # on a GPU: ViT-B/16, ViT-L/14, ViT-g/14 (random weights)
    python benchmarks/gpu_pipeline.py --cpu                 # ViT-B/16 on the CPU with the image counts scaled down
    python benchmarks/gpu_pipeline.py --tiny                # CPU smoke run (CI): a tiny ViT, a few images

The run is a list of phases, in the order their numbers matter: first each model's *core* (the run ``prune.py`` makes
by default: the importance pass over ``--images`` images with the default scorer, the head/MLP splits of the default
grid, the export of the six default budgets, no search), every stage timed against its floor
(:func:`benchmarks.stage_floors.measure_model`: the importance against the bare forward and probe backward passes of
the same images in the same precision) with its peak memory (CUDA max allocated on a GPU, the process's peak RSS on a
CPU) and, on CUDA, the host synchronisations it made (``torch.cuda.set_sync_debug_mode("warn")``, counted per
stage: :class:`benchmarks.stage_floors.Clock`), ViT-B/16, then ViT-L/14, then ViT-g/14; then each model's *extras*: the weight correction of one model, the
coefficient search (``--evaluations``: one run continued to the longer count, against the bare forwards of the same
pruned models) and the pruned models' throughput in bf16 and fp32. ``--budget-s`` stops the run cleanly when its
time is spent (the phase running is cut short and recorded as such, the later ones as not run), so that a lent
accelerator's lease keeps what finished; the results are written after every phase. Writes
``benchmarks/results/gpu_pipeline.{json,md}`` (``--cpu``: ``full_size_cpu``, ``--tiny``: ``gpu_pipeline_tiny``).
"""
from __future__ import annotations

import argparse
import copy
import gc
import platform
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import stage_floors  # noqa: E402
from benchmarks.common import RESULTS, machine_info, parse_args, write_results  # noqa: E402
from snapvit_pl.device import autocast_context, resolve_device, synchronize  # noqa: E402
from snapvit_pl.elastic import Budget  # noqa: E402
from snapvit_pl.eval import EvaluationSettings  # noqa: E402
from snapvit_pl.eval.throughput import measure_throughput  # noqa: E402
from snapvit_pl.models import BackboneSpec, embed, input_shape, load_backbone, prune_  # noqa: E402
from snapvit_pl.pipeline import (  # noqa: E402
    Correction, CorrectionSettings, ExportSettings, ImportanceSettings, Pipeline, PipelineSettings, SearchSettings, TensorInputs, scoring_views,
    search_snapshots,
)
from snapvit_pl.scoring import build_scorer  # noqa: E402

MODELS = {  # name -> timm architecture at 224 px, random weights, in the order their numbers matter
    "vit_b16_dino": BackboneSpec("vit_base_patch16_224.dino", False, None, {"num_classes": 0}),
    "vit_l14_dinov2": BackboneSpec("vit_large_patch14_dinov2.lvd142m", False, None, {"num_classes": 0, "img_size": 224}),
    "vit_g14_dinov2": BackboneSpec("vit_giant_patch14_dinov2.lvd142m", False, None, {"num_classes": 0, "img_size": 224}),
}
TINY = BackboneSpec("vit_small_patch16_224", False, None,
                    {"num_classes": 0, "img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 4})
#: The sizes of a real run (configs/prune/dino_vitb16.yaml): the per-image costs are scaled to these.
CONFIG_SIZES = {"images": 1000, "evaluations": 50, "fitness_images": 1000,
                "calibration": CorrectionSettings().num_samples}
#: The importance pass's batch on an accelerator (the presets' 16 leaves an H200 idle between kernels; ViT-g/14's
#: activations for 64 images and 4 probe backward passes fit in a few GB): prune.py's data.init_args.batch_size.
ACCELERATOR_SCORING_BATCH = 64


class OutOfTime(Exception):
    """The run's wall-time budget is spent."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`OutOfTime` in the code inside once ``seconds`` have passed (a SIGALRM timer; none if <= 0)."""
    def expire(signum: int, frame: object) -> None:
        raise OutOfTime()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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


def _settings(args: argparse.Namespace, evaluations: int = 0) -> PipelineSettings:
    importance = ImportanceSettings(build_scorer(args.scorer) if args.scorer else None)
    return PipelineSettings(
        importance=importance, evaluation=EvaluationSettings(metrics=[]),
        search=SearchSettings(max_evaluations=evaluations, popsize=args.popsize, num_images=args.fitness_images,
                              batch_size=args.fitness_batch, pca_components=args.pca_components),
        export=ExportSettings(split_grid=args.split_grid, split_candidates=args.split_candidates, save_models=True))


def _model(spec: BackboneSpec, device: torch.device) -> tuple[torch.nn.Module, float]:
    torch.manual_seed(0)
    started = time.perf_counter()
    model = load_backbone(spec).to(device).eval()
    synchronize(device)
    return model, time.perf_counter() - started


def core(spec: BackboneSpec, args: argparse.Namespace, device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """The default run (importance, splits, export; no search), every stage against its floor, its peak memory."""
    model, load_s = _model(spec, device)
    shape = input_shape(model)
    plain = torch.randn(args.images, *shape, generator=torch.Generator().manual_seed(0))
    fitness = torch.randn(args.fitness_images, *shape, generator=torch.Generator().manual_seed(1))
    settings = _settings(args)
    pipeline = Pipeline(model, settings, spec=spec, inputs=TensorInputs(fitness), progress="lines")
    views = scoring_views(settings.importance.scorer)
    if views != "plain":
        raise SystemExit("error: the core phase times the default run's plain-image scorers; choose one with --scorer")
    batches = [b.to(device, non_blocking=True) for b in plain.split(args.scoring_batch)]
    measured = stage_floors.measure_model(spec.model_name, pipeline, batches, fitness, stage_floors.Clock(device), None,
                                          log)
    state = pipeline.state
    stages = measured["stages"]
    return {"spec": spec.to_dict(), "scorer": {**settings.importance.scorer_record(), **state.method.get("scorer", {})},
            "load_s": load_s, "scoring_batch": args.scoring_batch, "images": args.images,
            "fitness_images": args.fitness_images, "stages": stages, "peak_memory_mb": dict(state.peak_memory_mb),
            "memory": state.memory_kind, "splits_chosen": len(state.splits), "models": len(state.extracted),
            "total_s": sum(stages[k]["seconds"] for k in ("importance", "splits", "export")),
            "importance_s_at_config": stages["importance"]["seconds"] / args.images * CONFIG_SIZES["images"]}


def extras(spec: BackboneSpec, args: argparse.Namespace, device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """The optional stages: the correction of one model, the coefficient search against its floor, throughput."""
    model, _ = _model(spec, device)
    shape = input_shape(model)
    plain = torch.randn(args.images, *shape, generator=torch.Generator().manual_seed(0))
    fitness = torch.randn(args.fitness_images, *shape, generator=torch.Generator().manual_seed(1))
    first, last = min(args.evaluations), max(args.evaluations)
    settings = _settings(args, first)
    settings.export = replace(settings.export, budgets=[Budget(flops=0.5)], split_grid=0, save_models=False)
    pipeline = Pipeline(model, settings, spec=spec, inputs=TensorInputs(fitness), progress="lines")
    pipeline.importance([b.to(device) for b in plain.split(args.scoring_batch)])
    pipeline.search()
    pipeline.choose_splits()
    items = pipeline.export()
    out: dict[str, Any] = {"search_s": pipeline.state.timings.search_s,
                           "search_s_per_evaluation_per_fitness_image":
                               pipeline.state.timings.search_s / (first * args.fitness_images)}
    calibration = torch.randn(args.calibration_images, *shape, generator=torch.Generator().manual_seed(2))
    correct = Correction(CorrectionSettings(enabled=True, num_samples=args.calibration_images), calibration.to(device))
    synchronize(device)
    started = time.perf_counter()
    correct(model, items[0].subnet)
    synchronize(device)
    out["correction_one_model_s"] = time.perf_counter() - started
    out["correction_s_at_config"] = out["correction_one_model_s"] / args.calibration_images * CONFIG_SIZES["calibration"]
    out["correction_reconstruct_steps"] = CorrectionSettings().steps_on(device)  # auto: none on the CPU
    log(f"{spec.model_name}: correction of one model {out['correction_one_model_s']:.1f} s")
    images = fitness.to(device)
    evaluated: list[torch.Tensor] = []

    def collect(es, candidates, values) -> None:
        if es.evaluations <= first:
            evaluated.extend(candidates)

    local = replace(pipeline.elastic_scores(), coefficients=None)
    snapshots = search_snapshots(model, images, local, replace(settings.search, max_evaluations=last), args.evaluations,
                                 on_generation=collect)
    short, long = snapshots[first], snapshots[last]
    bare = bare_forwards(model, local, settings.search, evaluated, images, device)
    out["search"] = {str(first): {"best_fitness": short.best_fitness, "seconds": short.seconds},
                     str(last): {"best_fitness": long.best_fitness, "seconds": long.seconds},
                     "floor": {"search_s": short.seconds, "bare_forward_s": bare, "ratio": short.seconds / bare}}
    log(f"{spec.model_name}: search {first} evaluations {short.seconds:.1f} s against {bare:.1f} s of bare forwards")
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
    out["throughput"] = throughput
    return out


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    how = " --tiny" if report["tiny"] else " --cpu" if report["cpu"] else ""
    lines = ["# The pipeline on full-size models", "",
             f"`python benchmarks/gpu_pipeline.py{how} --budget-s {s['budget_s']:g}` on {report['device']}, "
             f"{report['machine']['date']}, {report['machine']['torch_threads']} torch thread(s); random weights, "
             f"synthetic images: {s['images']} images for the importance (batches of {s['scoring_batch']}), "
             f"{s['fitness_images']} fitness images, the split grid every {s['split_grid']:.0%} with "
             f"{s['split_candidates']} candidates, the six default budgets exported. {report['total_s']:.0f} s in all.",
             "", "| phase | status | seconds |", "|---|---|---:|"]
    lines += [f"| {p['phase']} | {p['status']} | {p.get('seconds', 0):.1f} |" for p in report["phases"]]
    for name, entry in report["core"].items():
        scorer = entry["scorer"]
        lines += ["", f"## {name} (`{entry['spec']['model_name']}`): the default run", "",
                  f"Scorer `{scorer['name']}` (Gram `{scorer.get('gram_used', '-')}`: {scorer.get('gram_why', '-')}); "
                  f"loading the model {entry['load_s']:.1f} s; importance + splits + export {entry['total_s']:.1f} s "
                  f"({entry['importance_s_at_config']:.1f} s of importance at {CONFIG_SIZES['images']} images).", "",
                  f"| stage | seconds | floor (s) | stage / floor | peak memory (MiB, {entry['memory']}) | "
                  "host syncs (CUDA) | the floor |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        lines += [f"| {stage} | {r['seconds']:.2f} | {r['floor_s']:.2f} | {r['ratio']:.2f} | "
                  f"{entry['peak_memory_mb'].get(stage, float('nan')):,.0f} | "
                  f"{'n/a' if r.get('host_syncs') is None else r['host_syncs']} | {r['floor']} |"
                  for stage, r in entry["stages"].items()]
    for name, entry in report["extras"].items():
        floor = entry["search"]["floor"]
        lines += ["", f"## {name}: the optional stages", "",
                  f"- correction of one model: {entry['correction_one_model_s']:.1f} s "
                  f"({entry['correction_s_at_config']:.1f} s at {CONFIG_SIZES['calibration']} calibration images)",
                  "- search: " + ", ".join(f"{k} evaluations: fitness {v['best_fitness']:.4f} in {v['seconds']:.1f} s"
                                           for k, v in entry["search"].items() if k != "floor"),
                  f"- search floor: {floor['search_s']:.1f} s against {floor['bare_forward_s']:.1f} s of bare pruned "
                  f"forwards (ratio {floor['ratio']:.2f})", ""]
        keys = [k for k in entry["throughput"][0] if k.endswith("images_per_s")]
        lines += ["| model | params | " + " | ".join(k.removesuffix("_images_per_s") for k in keys) + " |",
                  "|---|---:|" + "---:|" * len(keys)]
        lines += [f"| {row['model']} | {row['params'] / 1e6:.1f}M | " + " | ".join(f"{row[k]:.0f}" for k in keys) + " |"
                  for row in entry["throughput"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: a tiny ViT and a few images")
    parser.add_argument("--cpu", action="store_true", help="ViT-B/16 on the CPU, image counts scaled down")
    parser.add_argument("--models", default=",".join(MODELS), help=f"subset of {','.join(MODELS)}, in order")
    parser.add_argument("--extras", default="vit_b16_dino,vit_l14_dinov2", help="models whose optional stages run "
                        "after every model's core ('' for none)")
    parser.add_argument("--budget-s", type=float, default=600.0, help="wall-time budget: stop cleanly when spent")
    parser.add_argument("--images", type=int, default=1000, help="importance images")
    parser.add_argument("--scoring-batch", type=int, default=None,
                        help=f"importance batch (default {ACCELERATOR_SCORING_BATCH} on an accelerator, 16 elsewhere)")
    parser.add_argument("--scorer", default=None, help="a label-free plain-image scorer name (default: the pipeline's)")
    parser.add_argument("--evaluations", default="50,500", help="search evaluation counts (one continued run)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    parser.add_argument("--device", default=None, help="default: CUDA if available")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/gpu_pipeline[_tiny])")
    args = parse_args(parser, argv)
    started = time.perf_counter()
    args.evaluations = [int(e) for e in args.evaluations.split(",")]
    args.fitness_images, args.fitness_batch, args.pca_components = 1000, 250, 192
    args.calibration_images = CONFIG_SIZES["calibration"]  # the default (with reconstruction on an accelerator)
    args.popsize, args.split_grid, args.split_candidates = 8, 0.1, 7
    args.throughput_batches, args.warmup, args.repeats, args.precisions = [1, 64, 256], 5, 20, ("bf16", "32")
    specs = {name: MODELS[name] for name in args.models.split(",")}
    extra = [name for name in args.extras.split(",") if name in specs]
    if args.tiny:
        specs, extra = {"tiny": TINY}, ["tiny"]
        args.images, args.evaluations, args.fitness_images, args.fitness_batch = 32, [4, 8], 32, 32
        args.pca_components, args.throughput_batches, args.warmup, args.repeats = 8, [1, 8], 1, 2
        args.popsize, args.split_grid, args.split_candidates, args.calibration_images = 4, 0.5, 2, 8
    elif args.cpu:  # scaled down: the per-image costs are what matter
        specs, extra = {"vit_b16_dino": MODELS["vit_b16_dino"]}, ["vit_b16_dino"]
        args.images, args.evaluations, args.fitness_images, args.fitness_batch = 8, [4, 8], 16, 16
        args.pca_components, args.throughput_batches, args.warmup, args.repeats = 16, [1, 16], 1, 3
        args.popsize, args.split_grid, args.split_candidates, args.precisions = 4, 0.25, 3, ("32",)  # CPU bf16 is slow
        args.calibration_images = 16
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device("cpu" if (args.tiny or args.cpu) and args.device is None else args.device)
    if args.scoring_batch is None:
        args.scoring_batch = ACCELERATOR_SCORING_BATCH if device.type == "cuda" else 16
    if device.type != "cuda" and not (args.tiny or args.cpu):
        print("warning: no GPU: the full-size run on CPU takes hours; use --cpu (scaled down) or --tiny", file=sys.stderr)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    report: dict[str, Any] = {"benchmark": "benchmarks/gpu_pipeline.py", "tiny": args.tiny, "cpu": args.cpu,
                              "device": f"{device} ({name})",
                              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "device")},
                              "phases": [], "core": {}, "extras": {}}
    default = "gpu_pipeline_tiny" if args.tiny else "full_size_cpu" if args.cpu else "gpu_pipeline"
    prefix = Path(args.out) if args.out else RESULTS / default

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    phases = [("core", n, specs[n]) for n in specs] + [("extras", n, specs[n]) for n in extra]
    for kind, model_name, spec in phases:
        phase = {"phase": f"{model_name} {kind}"}
        left = args.budget_s - (time.perf_counter() - started)
        if left <= 0:
            phase["status"] = "not run: the budget was spent"
        else:
            begun = time.perf_counter()
            try:
                with deadline(left):
                    report[kind][model_name] = (core if kind == "core" else extras)(spec, args, device, log)
                phase["status"] = "done"
            except OutOfTime:
                phase["status"] = f"stopped at the budget ({args.budget_s:g} s)"
            phase["seconds"] = time.perf_counter() - begun
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        report["phases"].append(phase)
        log(f"{phase['phase']}: {phase['status']}")
        # written after every phase: a run cut short (a lease that ends) keeps what it finished
        report["total_s"] = time.perf_counter() - started
        report["machine"] = machine_info()
        write_results(prefix, report, markdown, args)
    log(f"wrote {prefix}.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
