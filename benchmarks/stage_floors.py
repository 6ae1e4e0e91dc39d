"""Every stage of a pruning run against its floor: the bare forward and backward passes it must make.

    python benchmarks/stage_floors.py                  # the demo model, ViT-B/16 (scaled down), a 2-process run
    python benchmarks/stage_floors.py --tiny           # smoke run (CI): a tiny ViT, a few images, no 2-process run
    python benchmarks/stage_floors.py --device cuda    # the same on a GPU (benchmarks/gpu_pipeline.py calls it too)

For each model the stages run through the driver ``prune.py`` runs (:class:`snapvit_pl.pipeline.Pipeline`), and the
floor of each is timed in the same process, right after it:

- importance (the default score): one forward pass with the unit masks and one backward pass per probe, over the
  same batches (plain random probes, no accumulation);
- splits: the dense forward of the fitness images (their embeddings and PCA) and, for every distinct candidate the
  split choice raced, the forward of a physically pruned copy (made outside the timer) over the images it was
  raced on;
- export: for every model (the dense one included), the forward of its evaluation images (k-NN memory and scored
  images), or, without an evaluation, the cut alone.

The demo model is the reference ViT with ``configs/prune/demo.yaml`` (metrics k-NN and own head: the forward passes;
the linear probe's training and the throughput timing are work of another kind). ViT-B/16 is the real architecture at
224 px with random weights and synthetic images, the image counts scaled down; its costs per image are scaled to the
sizes of ``configs/prune/dino_vitb16.yaml`` (1000 importance images, 1000 fitness images, the default budgets and
grid, 7 candidates): the split choice's share of the exhaustive forwards is the one
``benchmarks/split_choice.py`` measured on the development models. Times are the CPU time of the one-thread process
(the other jobs of a shared machine stretch its wall clock, also recorded) on the CPU, the wall clock on a GPU.
Before them (while this process holds no full-size model), ``prune.py`` on the demo model with one process and with
two (gloo), three times each, alternately: the wall time of the split stage and of the export (rank 0's report; the
medians, and the ratio of each pair of runs), and whether the scores file and every model file are the same bytes in
every run. Last, the start-up of ``prune.py`` (``START_UP``).
Writes ``benchmarks/results/stage_floors.json`` and ``.md`` (``--tiny``: ``stage_floors_tiny``).
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    RESULTS, ROOT, Progress, machine_info, model_overrides, parse_args, prune_setup, write_results,
)
from snapvit_pl.device import resolve_device, synchronize  # noqa: E402
from snapvit_pl.elastic import Budget, CostModel, default_budgets  # noqa: E402
from snapvit_pl.elastic.budget import max_prune_ratio, resolve  # noqa: E402
from snapvit_pl.errors import PruningSpecError  # noqa: E402
from snapvit_pl.eval import EvaluationSettings  # noqa: E402
from snapvit_pl.models import BackboneSpec, embed, input_shape, load_backbone, prune_, prunable_blocks  # noqa: E402
from snapvit_pl.pipeline import (  # noqa: E402
    ExportSettings, ImportanceSettings, Pipeline, PipelineSettings, SearchSettings, TensorInputs,
)
from snapvit_pl.pipeline.data_source import use_datamodule  # noqa: E402
from snapvit_pl.pipeline.splits import split_candidates, split_points  # noqa: E402
from snapvit_pl.scoring.sensitivity import unit_masks  # noqa: E402
from snapvit_pl.search.race import subnet_key  # noqa: E402

VIT_B = BackboneSpec("vit_base_patch16_224.dino", False, None, {"num_classes": 0})
TINY = BackboneSpec("vit_small_patch16_224", False, None,
                    {"num_classes": 0, "img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 4})
#: configs/prune/dino_vitb16.yaml: the sizes the full-size costs are scaled to.
#: ViT-B/16's importance in seconds per image on one CPU thread before issue 30 (8 probes, host-side probe loop).
IMPORTANCE_BEFORE_S = 4.9
DINO = {"images": 1000, "fitness_images": 1000, "split_grid": 0.1, "split_candidates": 7, "mlp_multiple": 8}


class Clock:
    """CPU time of this process on the CPU (one thread: what the stage itself spent), wall time on a GPU.

    On CUDA each timed call also runs under ``torch.cuda.set_sync_debug_mode("warn")``: :attr:`syncs` is the number
    of host synchronisations CUDA reported in the last call (its implicit waits: a read back, a blocking copy; not
    the clock's own ``synchronize``); None on other devices (a CPU waits for nothing).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.syncs: Optional[int] = None

    def __call__(self, function: Callable[[], Any]) -> tuple[Any, float, float]:
        """``(result, seconds, wall seconds)``."""
        import warnings

        synchronize(self.device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if self.device.type == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            try:
                wall, cpu = time.perf_counter(), time.process_time()
                result = function()
                synchronize(self.device)
                wall = time.perf_counter() - wall
            finally:
                if self.device.type == "cuda":
                    torch.cuda.set_sync_debug_mode("default")
        if self.device.type == "cuda":
            self.syncs = sum("synchroniz" in str(w.message) for w in caught)
        for w in caught:  # what else was warned goes on to the user
            if "synchroniz" not in str(w.message):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return result, (wall if self.device.type == "cuda" else time.process_time() - cpu), wall


def importance_floor(model: torch.nn.Module, batches: list[torch.Tensor], probes: int) -> None:
    """The passes the default score must make: a forward with the unit masks, one backward per probe."""
    blocks = prunable_blocks(model)
    groups = [(f"{b.index}.{k}", k, getattr(b, k)) for b in blocks for k in ("heads", "neurons")]
    device = next(model.parameters()).device
    for images in batches:
        images = images.to(device)
        masks = {key: torch.ones(len(images), g.num_units, device=device, requires_grad=True) for key, _, g in groups}
        with torch.enable_grad(), unit_masks(groups, masks):
            out = F.normalize(embed(model, images).float(), dim=-1)
            for k in range(probes):
                torch.autograd.grad(out, list(masks.values()), grad_outputs=torch.randn_like(out),
                                    retain_graph=k + 1 < probes)


@torch.inference_mode()
def forwards(models: list[tuple[torch.nn.Module, torch.Tensor]], batch_size: int) -> None:
    """Embedding forwards of each model over its images."""
    for model, images in models:
        for batch in images.split(batch_size):
            embed(model, batch)


def split_floor_models(pipeline: Pipeline) -> list[tuple[torch.nn.Module, int]]:
    """A physically pruned copy of every distinct candidate the split choice raced, with the images it saw."""
    scores, cost = pipeline.elastic_scores(), pipeline.cost
    heads, neurons = scores.unified()
    keep = (scores.min_mlp_keep, scores.min_head_keep, pipeline.settings.export.mlp_multiple)
    seen: dict[Any, tuple[Any, int]] = {}
    for choice in pipeline.state.splits:
        budget = Budget(params=choice.keep) if choice.metric == "params" else Budget(flops=choice.keep)
        for (h, _, _), images in zip(choice.candidates, choice.images):
            subnet = resolve(budget, heads, neurons, cost, *keep, head_ratio=h)[0]
            key = subnet_key(subnet)
            seen[key] = (subnet, max(images, seen.get(key, (None, 0))[1]))
    return [(prune_(copy.deepcopy(pipeline.model), subnet), images) for subnet, images in seen.values()]


def measure_model(name: str, pipeline: Pipeline, batches: list, fitness: torch.Tensor, clock: Clock,
                  eval_images: Optional[list[torch.Tensor]], log: Progress) -> dict[str, Any]:
    """Each stage of ``pipeline`` and its floor."""
    model, s = pipeline.model, pipeline.settings
    rows: dict[str, dict[str, float]] = {}

    syncs: dict[str, Optional[int]] = {}

    def timed(stage: str, function: Callable[[], Any]) -> tuple[Any, float, float]:
        measured = clock(function)
        syncs[stage] = clock.syncs  # the stage's host synchronisations (CUDA), before the floor's clock runs
        return measured

    def row(stage: str, seconds: float, wall: float, floor: float, note: str) -> None:
        rows[stage] = {"seconds": seconds, "wall_s": wall, "floor_s": floor, "ratio": seconds / floor, "floor": note,
                       "host_syncs": syncs.get(stage)}
        log(f"{name} {stage}: {seconds:.2f} s against a floor of {floor:.2f} s ({seconds / floor:.2f}x)"
            + ("" if syncs.get(stage) is None else f", {syncs[stage]} host synchronisations"))

    probes = getattr(s.importance.scorer, "probes", 8)
    plain = [b[0] if isinstance(b, (list, tuple)) else b for b in batches]
    importance_floor(model, plain[:1], 1)  # warm-up (allocator, kernels): neither stage nor floor pays it
    _, seconds, wall = timed("importance", lambda: pipeline.importance(batches))
    _, floor, _ = clock(lambda: importance_floor(model, plain, probes))
    row("importance", seconds, wall, floor, f"1 forward + {probes} backward passes per image")
    pipeline.search()
    _, seconds, wall = timed("splits", pipeline.choose_splits)
    copies = split_floor_models(pipeline)
    images = fitness.to(pipeline.device)
    _, floor, _ = clock(lambda: forwards([(model, images)] + [(m, images[:n]) for m, n in copies], s.search.batch_size))
    row("splits", seconds, wall, floor, f"the dense forward + {len(copies)} raced candidates' forwards")
    raced = sum(n * pipeline.cost.flops(_subnet_of(m)) / pipeline.cost.dense_flops for m, n in copies)
    with tempfile.TemporaryDirectory() as out:
        items, seconds, wall = timed("export", lambda: pipeline.export(models_dir=out))
    pruned = [prune_(copy.deepcopy(model), item.subnet) for item in items]
    if eval_images is not None:
        evaluated = torch.cat(eval_images).to(pipeline.device)
        _, floor, _ = clock(lambda: forwards([(m, evaluated) for m in [model, *pruned]], s.evaluation.batch_size))
        note = f"{len(pruned) + 1} models' forwards of {len(evaluated)} evaluation images"
    else:
        _, floor, _ = clock(lambda: [prune_(copy.deepcopy(model), item.subnet) for item in items])
        note = f"the cut of {len(items)} models"
    row("export", seconds, wall, floor, note)
    return {"stages": rows, "importance_images": sum(len(b) for b in batches), "importance_probes": probes,
            "fitness_images": len(fitness),
            "splits_chosen": len(pipeline.state.splits), "raced_dense_image_equivalents": raced,
            "timings": pipeline.state.timings.to_dict()}


def _subnet_of(model: torch.nn.Module):
    from snapvit_pl.models import Subnet

    blocks = prunable_blocks(model)
    return Subnet.from_counts([b.heads.num_units for b in blocks], [b.neurons.num_units for b in blocks])


def demo_overrides(tiny: bool) -> list[str]:
    """``prune.py`` overrides of the demo runs (the k-NN and own-head metrics: forward passes only)."""
    overrides = ["--evaluation.metrics=[knn, head]", "--progress=off", "--report.print_table=false"]
    if tiny:
        overrides += ["--data.init_args.max_samples=32", "--search.num_images=32", "--search.batch_size=32",
                      "--search.pca_components=8", "--evaluation.train_samples=64", "--evaluation.val_samples=32",
                      "--export.budgets=[{sparsity: 0.4}]", "--export.split_grid=0.5"]
    return overrides


def demo(args: argparse.Namespace, clock: Clock, log: Progress) -> dict[str, Any]:
    """The reference model with the demo's settings (Fashion-MNIST)."""
    setup = prune_setup(*model_overrides("reference"), *demo_overrides(args.tiny))
    pipeline = Pipeline(setup.model, setup.settings, spec=setup.spec, progress="off")
    use_datamodule(pipeline, setup.datamodule)
    batches = list(setup.datamodule.train_dataloader())
    fitness = pipeline.fitness_images()
    data = pipeline.inputs.evaluation_data(setup.settings.evaluation)
    eval_images = [x for x, _ in data.train] + [x for x, _ in data.val]
    return measure_model("demo", pipeline, batches, fitness, clock, eval_images, log)


def full_size(spec: BackboneSpec, args: argparse.Namespace, clock: Clock, log: Progress) -> dict[str, Any]:
    """A full-size architecture, random weights, synthetic images, the counts scaled down (``args``)."""
    torch.manual_seed(0)
    model = load_backbone(spec).to(clock.device).eval()
    shape = input_shape(model)
    images = torch.randn(args.images, *shape, generator=torch.Generator().manual_seed(0))
    fitness = torch.randn(args.fitness_images, *shape, generator=torch.Generator().manual_seed(1))
    settings = PipelineSettings(
        importance=ImportanceSettings(), evaluation=EvaluationSettings(metrics=[]),
        search=SearchSettings(num_images=args.fitness_images, batch_size=args.fitness_images,
                              pca_components=min(16, args.fitness_images)),
        export=ExportSettings(budgets=[{"flops": 0.5}], split_grid=args.split_grid,
                              split_candidates=args.split_candidates, save_models=True))
    pipeline = Pipeline(model, settings, spec=spec, inputs=TensorInputs(fitness), progress="off")
    batches = [b.to(clock.device) for b in images.split(16)]
    entry = measure_model(spec.model_name, pipeline, batches, fitness, clock, None, log)
    _, dense, _ = clock(lambda: forwards([(model, fitness.to(clock.device))], len(fitness)))
    entry["dense_forward_s_per_image"] = dense / len(fitness)
    entry["dino_config"] = dino_estimate(model, entry, args)
    return entry


def dino_estimate(model: torch.nn.Module, entry: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The importance and the split choice at ``configs/prune/dino_vitb16.yaml``'s sizes, from the measured costs.

    The split choice: the dense forward of 1000 fitness images, plus the candidates' forwards: every candidate of
    every window (the default budgets and grid; random scores: reachability and window do not depend on them) on
    every image for the exhaustive choice, the share ``split_choice.md`` measured for the raced one; each image
    through a candidate costs its FLOPs fraction of a dense forward, times the overhead the stage measured over
    its floor here."""
    stages = entry["stages"]
    dense = entry["dense_forward_s_per_image"]
    overhead = stages["splits"]["ratio"]
    cost = CostModel(model)
    g = torch.Generator().manual_seed(0)
    blocks = prunable_blocks(model)
    heads = [torch.rand(b.heads.num_units, generator=g) for b in blocks]
    neurons = [torch.rand(b.neurons.num_units, generator=g) for b in blocks]
    max_head = max_prune_ratio(heads, 0.2)
    candidate_flops = 0.0  # sum over every feasible candidate of its kept FLOPs fraction
    points = 0
    for _, metric, keep, _ in split_points(default_budgets(), cost, DINO["split_grid"]):
        budget = Budget(params=keep) if metric == "params" else Budget(flops=keep)
        try:
            schedule = resolve(budget, heads, neurons, cost, 0.05, 0.2, DINO["mlp_multiple"])[2]
        except PruningSpecError:
            continue
        points += 1
        for h in split_candidates(schedule, DINO["split_candidates"], 0.1, max_head):
            try:
                subnet = resolve(budget, heads, neurons, cost, 0.05, 0.2, DINO["mlp_multiple"], head_ratio=h)[0]
            except PruningSpecError:
                continue
            candidate_flops += cost.flops(subnet) / cost.dense_flops
    share = _raced_share()
    n = DINO["fitness_images"]
    exhaustive_s = overhead * dense * n * (1 + candidate_flops)
    raced_s = overhead * dense * n * (1 + share * candidate_flops)
    return {"importance_s": stages["importance"]["seconds"] / entry["importance_images"] * DINO["images"],
            "split_points": points, "candidates_dense_equivalent": candidate_flops,
            "raced_share_of_exhaustive_flops": share, "splits_exhaustive_s": exhaustive_s, "splits_raced_s": raced_s}


def _raced_share() -> float:
    """The raced split choice's share of the exhaustive forwards with 1000 fitness images
    (``benchmarks/results/split_choice.json``)."""
    path = RESULTS / "split_choice.json"
    return float(json.loads(path.read_text())["summary"]["raced_flops_fraction_at_1000_images"])


def _rank(rank: int, world: int, init: str, local: str, run_dir: str, tiny: bool, out: str) -> None:
    """One process of :func:`rank_times`: the demo's split choice and export on ``world`` gloo processes, each
    stage's CPU time and wall time on this rank written to ``out``."""
    import torch.distributed as dist

    from snapvit_pl.pipeline import Distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)

    def all_gather(tensor: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(parts, tensor)
        return torch.stack(parts)

    def gather_objects(value: Any) -> list[Any]:
        parts: list[Any] = [None] * world
        dist.all_gather_object(parts, value)
        return parts

    setup = prune_setup(*model_overrides("reference"), *demo_overrides(tiny))
    pipeline = Pipeline(setup.model, setup.settings, spec=setup.spec, run_dir=run_dir, progress="off",
                        dist=Distributed(rank, world, None, all_gather if world > 1 else None,
                                         gather_objects if world > 1 else None))
    use_datamodule(pipeline, setup.datamodule)
    pipeline.load_state_dict({"local": torch.load(local)})  # the importance pass is done (the same for both)
    pipeline.search()
    times = {}
    for stage, run in (("splits", pipeline.choose_splits), ("export", pipeline.export)):
        dist.barrier()
        _, seconds, wall = Clock(torch.device("cpu"))(run)
        times[stage] = {"cpu_s": seconds, "wall_s": wall}
    Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def rank_times(args: argparse.Namespace, log: Progress) -> dict[str, Any]:
    """The demo's split choice and export on one and on two gloo processes (the importance pass done once before):
    each rank's CPU time per stage (the work it did; its wall time waits for cores on a shared machine)."""
    import multiprocessing

    setup = prune_setup(*model_overrides("reference"), *demo_overrides(args.tiny))
    pipeline = Pipeline(setup.model, setup.settings, spec=setup.spec, progress="off")
    use_datamodule(pipeline, setup.datamodule)
    local = pipeline.importance(setup.datamodule.train_dataloader())
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(local.to_dict(), Path(tmp) / "local.pt")
        for world in (1, 2):
            outs = [str(Path(tmp) / f"times{world}_{r}.json") for r in range(world)]
            processes = [multiprocessing.get_context("spawn").Process(
                target=_rank, args=(r, world, str(Path(tmp) / f"init{world}"), str(Path(tmp) / "local.pt"),
                                    str(Path(tmp) / f"run{world}"), args.tiny, outs[r])) for r in range(world)]
            for process in processes:
                process.start()
            for process in processes:
                process.join()
                if process.exitcode != 0:
                    raise SystemExit(f"error: a rank of the {world}-process run failed (exit {process.exitcode})")
            result[str(world)] = [json.loads(Path(o).read_text()) for o in outs]
            log(f"{world} process(es): " + ", ".join(
                f"{stage} CPU {max(r[stage]['cpu_s'] for r in result[str(world)]):.1f} s" for stage in ("splits", "export")))
    for stage in ("splits", "export"):
        result[f"{stage}_cpu_ratio"] = max(r[stage]["cpu_s"] for r in result["2"]) / result["1"][0][stage]["cpu_s"]
    return result


def two_processes(args: argparse.Namespace, log: Progress, repeats: int = 3) -> dict[str, Any]:
    """``prune.py`` on the demo model with one process and with two (gloo), ``repeats`` times alternately: the split
    and export wall times of each run (rank 0's report), their medians and the ratio of the medians, and whether every
    run wrote the same scores file and model files."""
    common = ["--evaluation.metrics=[knn, head]", "--report.print_table=false", "--report.plots=false",
              "--progress=off", "--trainer.accelerator=cpu", "--trainer.logger=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs: dict[str, list[dict[str, Any]]] = {"one": [], "two": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            for name, extra in (("one", []), ("two", ["--trainer.devices=2"])):
                out = Path(tmp) / f"{name}{repeat}"
                started = time.perf_counter()
                result = subprocess.run([sys.executable, str(ROOT / "prune.py"), "--out_dir", str(out), *common, *extra],
                                        capture_output=True, text=True, cwd=tmp, env=env)
                if result.returncode != 0:
                    raise SystemExit(f"error: prune.py ({name}) failed:\n{result.stderr[-2000:]}")
                timings = json.loads((out / "report.json").read_text())["timings"]
                files = [out / "elastic_scores.safetensors",
                         *sorted(f for f in (out / "models").rglob("*") if f.is_file())]
                run = {"wall_s": time.perf_counter() - started, "splits_s": timings["splits_s"],
                       "export_s": sum(timings.get(k, 0.0) for k in ("export_s", "evaluation_s", "correction_s")),
                       "sha256": {str(f.relative_to(out)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}}
                runs[name].append(run)
                log(f"prune.py, {name} process(es), run {repeat + 1}/{repeats}: splits {run['splits_s']:.1f} s, "
                    f"export {run['export_s']:.1f} s")
    hashes = [run["sha256"] for name in runs for run in runs[name]]
    summary: dict[str, Any] = {"repeats": repeats, "runs": runs, "same_files": all(h == hashes[0] for h in hashes),
                               "files": len(hashes[0])}
    for name in runs:
        summary[name] = {f"{stage}_s": statistics.median(run[f"{stage}_s"] for run in runs[name])
                         for stage in ("splits", "export")}
    for stage in ("splits", "export"):
        summary[f"{stage}_ratio"] = summary["two"][f"{stage}_s"] / summary["one"][f"{stage}_s"]
        ratios = [t[f"{stage}_s"] / o[f"{stage}_s"] for o, t in zip(runs["one"], runs["two"])]
        summary[f"{stage}_ratio_range"] = [min(ratios), max(ratios)]
    return summary


#: ``prune.py`` command lines whose start-up is timed (what a user types before any work starts), by what they show.
START_UP = {"the help": ["--help"], "the resolved config": ["--print_config"],
            "an unknown option (error exit)": ["--no_such_option=1"],
            "a bad value (error exit after the config is parsed)": ["--data.init_args.batch_size=-1"]}


def start_up(log: Progress, repeats: int = 3) -> dict[str, Any]:
    """Wall seconds of each ``START_UP`` command line (a fresh interpreter each time; the median of ``repeats``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result: dict[str, Any] = {}
    for label, argv in START_UP.items():
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            done = subprocess.run([sys.executable, str(ROOT / "prune.py"), *argv], capture_output=True, text=True,
                                  env=env, cwd=ROOT)
            seconds.append(time.perf_counter() - started)
        result[label] = {"argv": argv, "exit_status": done.returncode, "seconds": statistics.median(seconds),
                         "all_s": seconds}
        log(f"prune.py {' '.join(argv)}: {result[label]['seconds']:.2f} s (exit {done.returncode})")
    return result


def _range(two: dict[str, Any], stage: str) -> str:
    low_high = two.get(f"{stage}_ratio_range")
    return f" ({low_high[0]:.2f} .. {low_high[1]:.2f})" if low_high else ""


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = ["# Every stage against its floor", "",
             f"`python benchmarks/stage_floors.py{' --tiny' if report['tiny'] else ''}` on {report['device']}, "
             f"{m['date']}, {m['torch_threads']} torch thread, load average {m['load_average_1m_at_end']} at the end "
             "(other jobs shared the machine). Seconds are the CPU time of the one-thread process (its wall clock in "
             "the JSON); each floor is timed right after its stage, in the same process.", ""]
    for name, entry in report["models"].items():
        lines += [f"## {name}", "", "| stage | seconds | floor (s) | stage / floor | the floor |", "|---|---:|---:|---:|---|"]
        for stage, r in entry["stages"].items():
            lines.append(f"| {stage} | {r['seconds']:.2f} | {r['floor_s']:.2f} | {r['ratio']:.2f} | {r['floor']} |")
        lines.append("")
        dino = entry.get("dino_config")
        if dino:
            lines += [f"At `configs/prune/dino_vitb16.yaml`'s sizes: importance {dino['importance_s'] / 60:.0f} min "
                      f"(1000 images); the split choice (the dense forward of 1000 fitness images and "
                      f"{dino['split_points']} budgets' windows, {dino['candidates_dense_equivalent']:.0f} dense-forward "
                      f"equivalents per image) {dino['splits_raced_s'] / 3600:.2f} h raced "
                      f"({dino['raced_share_of_exhaustive_flops']:.1%} of the candidates' forwards, "
                      f"`split_choice.md`), against {dino['splits_exhaustive_s'] / 3600:.1f} h for every candidate on "
                      "every image.", ""]
    vit = report["models"].get("vit_b16")
    if vit:
        per_image = vit["stages"]["importance"]["seconds"] / vit["importance_images"]
        lines += [f"ViT-B/16's importance: {per_image:.2f} s per image on one CPU thread with "
                  f"{vit['importance_probes']} probes, {per_image / IMPORTANCE_BEFORE_S:.0%} of the "
                  f"{IMPORTANCE_BEFORE_S} s per image (8 probes) measured before issue 30.", ""]
    if report.get("start_up"):
        repeats = len(next(iter(report["start_up"].values()))["all_s"])
        lines += ["## Start-up", "", f"`python prune.py ...` from a fresh interpreter, wall seconds (median of {repeats}):",
                  "",
                  "| command line | what it does | seconds | exit status |", "|---|---|---:|---:|"]
        what = {tuple(argv): label for label, argv in START_UP.items()}
        lines += [f"| `prune.py {' '.join(r['argv'])}` | {what.get(tuple(r['argv']), key)} | {r['seconds']:.2f} | "
                  f"{r['exit_status']} |" for key, r in report["start_up"].items()]
        lines.append("")
    two = report.get("two_processes")
    if two:
        lines += ["## Two processes (gloo) against one", "",
                  "`prune.py` on the demo model (`configs/prune/demo.yaml`, metrics k-NN and own head), wall seconds "
                  f"of rank 0's report, the median of {two.get('repeats', 1)} runs of each, one and two processes "
                  "alternately (the ratio of each pair of runs in brackets: this shared machine's other tenants "
                  "move the wall times):", "",
                  "| | 1 process | 2 processes | 2 / 1 |", "|---|---:|---:|---:|",
                  f"| split choice | {two['one']['splits_s']:.1f} | {two['two']['splits_s']:.1f} | "
                  f"{two['splits_ratio']:.2f}{_range(two, 'splits')} |",
                  f"| export (cut, evaluate, save) | {two['one']['export_s']:.1f} | {two['two']['export_s']:.1f} | "
                  f"{two['export_ratio']:.2f}{_range(two, 'export')} |", "",
                  f"The scores file and the {two['files'] - 1} model files are "
                  f"{'the same bytes (sha256)' if two['same_files'] else 'NOT the same bytes'} in every run.", ""]
        ranks = two["per_rank"]
        lines += ["The same two stages (the importance pass done once before) on one and two gloo processes started "
                  "from Python, the CPU time of each rank: the work each process does (with a core per process its "
                  "wall time is that plus the waits for the other rank at each gather; the wall times above depend on "
                  "how many of this shared 2-core machine's cores the other jobs leave free):", "",
                  "| | 1 process | 2 processes: rank 0 / rank 1 | slowest rank / 1 process |", "|---|---:|---:|---:|"]
        for stage, label in (("splits", "split choice"), ("export", "export")):
            one, two_ranks = ranks["1"][0][stage]["cpu_s"], [r[stage]["cpu_s"] for r in ranks["2"]]
            lines.append(f"| {label} | {one:.1f} | {two_ranks[0]:.1f} / {two_ranks[1]:.1f} | "
                         f"{ranks[f'{stage}_cpu_ratio']:.2f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="smoke run: a tiny ViT, few images, no 2-process run")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--two-processes", dest="two", action=argparse.BooleanOptionalAction, default=None,
                        help="the 2-process prune.py run (default: on the CPU, not with --tiny)")
    parser.add_argument("--out", default=None)
    args = parse_args(parser, argv)
    torch.set_num_threads(1)
    device = resolve_device(args.device)
    clock, log = Clock(device), Progress()
    log(f"1 torch thread, {device}")
    args.images, args.fitness_images, args.split_grid, args.split_candidates = 8, 16, 0.25, 3
    if args.tiny:
        args.images, args.fitness_images, args.split_grid, args.split_candidates = 4, 8, 0.5, 2
    report: dict[str, Any] = {"benchmark": "benchmarks/stage_floors.py", "tiny": args.tiny, "device": str(device),
                              "settings": {"vit_images": args.images, "vit_fitness_images": args.fitness_images,
                                           "vit_split_grid": args.split_grid, "vit_split_candidates": args.split_candidates},
                              "models": {}}
    # the multi-process runs first, while this process holds no full-size model (run after the ViT-B/16
    # measurement, the two-process split stage measured 5.8-6.7 s here; run alone, 3.6-3.7 s)
    if args.two if args.two is not None else (device.type == "cpu" and not args.tiny):
        report["two_processes"] = two_processes(args, log)
        report["two_processes"]["per_rank"] = rank_times(args, log)
    if device.type == "cpu":
        report["models"]["demo"] = demo(args, clock, log)
    spec = TINY if args.tiny else VIT_B
    report["models"]["vit_b16" if not args.tiny else "tiny"] = full_size(spec, args, clock, log)
    if not args.tiny:
        report["start_up"] = start_up(log)
    report["machine"] = machine_info()
    prefix = Path(args.out) if args.out else RESULTS / ("stage_floors_tiny" if args.tiny else "stage_floors")
    write_results(prefix, report, markdown, args,
                  subprocesses=True)  # prune.py ran in processes of its own (its start-up, its runs): all the code counts
    log(f"wrote {prefix}.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
