"""SnapViT (ours) vs. the baseline scorers at the paper's sparsity pairs, on the reference ViT. Not run in CI.

    python benchmarks/compare_methods.py            # full run: 7 methods x 6 pairs, 43 models (< 30 min on 2 CPU cores)
    python benchmarks/compare_methods.py --quick    # smoke run: tiny sizes, 2 pairs, 2 methods (~1-2 min)

Methods (no retraining, no weight correction; local scores from the same seeded 1000-image train subset prune.py uses):

- ``ours``: SSL Fisher local scores + xNES coefficients (search settings of configs/prune/demo.yaml);
- ``ssl_fisher``: the same local scores with the initial coefficients (``search.max_evaluations: 0``);
- ``label_fisher``, ``snip_magnitude``, ``lamp``, ``magnitude``, ``random``: the other scorers, also
  with the initial coefficients (``--baseline-coefficients none``: local scores alone).

The SSL gradients are computed once and shared by ``ours`` and ``ssl_fisher``. Every pruned model
(and the dense one) gets params, FLOPs, weighted k-NN / linear-probe / own-head top-1, the
Fashion-MNIST segmentation probe mIoU and CPU throughput (``snapvit_pl.evaluate.evaluate_model``).
Writes ``benchmarks/results/compare_methods.{md,json,png}`` (``--quick``: ``compare_methods_quick.*``).
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # callbacks/ when run as a script

from callbacks.export import PAPER_BUDGETS  # noqa: E402
from callbacks.importance import ImportanceCallback  # noqa: E402
from callbacks.search import SearchCallback  # noqa: E402
from snapvit_pl.data import ClassificationDataModule  # noqa: E402
from snapvit_pl.elastic import Budget, CostModel, ElasticScores, initial_coefficients  # noqa: E402
from snapvit_pl.evaluate import build_data, evaluate_model  # noqa: E402
from snapvit_pl.io import write_json_atomic, write_text_atomic  # noqa: E402
from snapvit_pl.models import BackboneSpec, fingerprint, load_backbone, load_pruned, prune_  # noqa: E402
from snapvit_pl.scoring import LocalScores, build_scorer  # noqa: E402
from snapvit_pl.search import XNES  # noqa: E402
from snapvit_pl.search.fitness import EmbeddingFitness  # noqa: E402

DEMO_CONFIG = ROOT / "configs" / "prune" / "demo.yaml"
REFERENCE = ROOT / "assets" / "reference_vit_fmnist"
RESULTS = ROOT / "benchmarks" / "results"
PAIRS = [(b["mlp_ratio"], b["head_ratio"]) for b in PAPER_BUDGETS]
METHODS = {  # name -> (scorer, xNES search)
    "ours": ("ssl_fisher", True), "ssl_fisher": ("ssl_fisher", False), "label_fisher": ("label_fisher", False),
    "snip_magnitude": ("snip_magnitude", False), "lamp": ("lamp", False), "magnitude": ("magnitude", False),
    "random": ("random", False),
}
METRICS = ["knn", "linear", "head", "seg", "throughput"]
REPORTED = [("knn_top1", "k-NN top-1"), ("linear_top1", "linear-probe top-1"), ("head_top1", "own-head top-1 (no retraining)"),
            ("seg_miou", "segmentation-probe mIoU")]


@dataclass
class Settings:
    """Sizes of one run. Scoring and search sizes default to configs/prune/demo.yaml (filled in by ``from_demo``)."""

    pairs: list[tuple[float, float]] = field(default_factory=lambda: list(PAIRS))
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    baseline_coefficients: str = "initial"
    scoring_images: int = 1000
    scoring_batch: int = 16
    search: dict[str, Any] = field(default_factory=dict)
    min_mlp_keep: float = 0.05
    min_head_keep: float = 0.2
    knn_train: int = 10000
    knn_val: int = 5000
    knn_k: int = 20
    seg_train: int = 500
    seg_val: int = 200
    seg_epochs: int = 10
    throughput_batch: int = 64
    throughput_repeats: int = 10
    eval_batch: int = 256
    seed: int = 0
    data: dict[str, Any] = field(default_factory=dict)
    scorer_args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_demo(cls, quick: bool = False) -> "Settings":
        demo = yaml.safe_load(DEMO_CONFIG.read_text())
        data = dict(demo["data"]["init_args"])
        search = SearchCallback(**demo.get("search", {})).settings()  # the callback's defaults for what the YAML omits
        importance = ImportanceCallback()
        settings = cls(scoring_images=data.get("max_samples", 1000), scoring_batch=data.get("batch_size", 16),
                       search=search, min_mlp_keep=importance.min_mlp_keep, min_head_keep=importance.min_head_keep,
                       seed=demo.get("seed_everything", 0), data=data,
                       scorer_args=dict(demo["importance"]["scorer"].get("init_args") or {}))
        if not quick:
            return settings
        return replace(settings, pairs=[PAIRS[2], PAIRS[5]], methods=["ours", "magnitude"], scoring_images=48,
                       search=dict(search, max_evaluations=6, num_images=64, batch_size=64, pca_components=16),
                       knn_train=300, knn_val=100, seg_train=32, seg_val=16, seg_epochs=2, throughput_repeats=3)


class Progress:
    """One line per stage with the elapsed time."""

    def __init__(self):
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[{time.perf_counter() - self.start:7.1f}s] {message}", flush=True)


def load_reference(path: Path = REFERENCE) -> tuple[torch.nn.Module, BackboneSpec, dict[str, Any]]:
    """The reference ViT (pruned-checkpoint format), else the demo config's architecture with random weights."""
    if (path / "architecture.json").is_file():
        model, record = load_pruned(path)
        return model, BackboneSpec.from_dict(record["base"]), {"source": _display(path), "reference": True}
    demo = yaml.safe_load(DEMO_CONFIG.read_text())["model"]
    spec = BackboneSpec(demo["model_name"], False, None, dict(demo.get("model_kwargs") or {}))
    torch.manual_seed(0)
    note = (f"{_display(path)} not found: the demo config's architecture with RANDOM weights; "
            "the accuracies say nothing about the methods")
    return load_backbone(spec), spec, {"source": "configs/prune/demo.yaml (random weights)", "reference": False, "warning": note}


def _display(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def local_scores(name: str, model: torch.nn.Module, dm: ClassificationDataModule, settings: Settings) -> LocalScores:
    """One scorer's local scores, fed as ``prune.py`` feeds it: multi-crop views, or labeled plain views for
    ``label_fisher``, of the same seeded class-balanced subset of the training split."""
    kwargs = {"ssl_fisher": settings.scorer_args, "snip_magnitude": {"n_global": settings.scorer_args.get("n_global", 2)},
              "random": {"seed": settings.seed}}.get(name, {})
    scorer = build_scorer(name, **kwargs)
    scorer.setup(model)
    if scorer.requires_data:
        n, batch = settings.scoring_images, settings.scoring_batch
        if scorer.requires_labels:
            loader = dm.labeled_dataloader("train", n, batch)
            assert loader.dataset.dataset is dm.unlabeled_dataset("train", "multicrop", n).dataset  # same images
        else:
            loader = dm.unlabeled_dataloader(views="multicrop", batch_size=batch, max_samples=n)
        for batch_ in loader:
            scorer.update(batch_)
    scorer.reduce(lambda t: t)
    return scorer.compute()


def search_snapshots(model: torch.nn.Module, dm: ClassificationDataModule, local: ElasticScores, search: dict[str, Any],
                     budgets: Sequence[int]) -> dict[int, dict[str, Any]]:
    """xNES over the block/head coefficients, as ``SearchCallback`` runs it on one process, continued up to each
    evaluation budget in turn. Per budget: the best coefficients so far (the initial ones unless beaten) and stats.
    A generation in progress at an intermediate budget is cut short there (as ``XNES.optimize`` does)."""
    mean = initial_coefficients(len(local.head_scores), local.heads_per_block, *search["initial_range"])
    fitness = EmbeddingFitness(model, dm.unlabeled_images(search["num_images"], search["batch_size"]), local,
                               search["sparsity_pairs"], search["pca_components"], search["batch_size"])
    initial = fitness(mean)
    es = XNES(mean, sigma=search["sigma"], popsize=search["popsize"], seed=search["seed"])
    snapshots = {}
    for budget in sorted(budgets):
        es.optimize(fitness, budget)
        improved = es.best_x is not None and es.best_fitness < initial
        snapshots[budget] = {
            "coefficients": (es.best_x if improved else mean).float(), "evaluations": es.evaluations,
            "initial_fitness": initial, "best_fitness": min(es.best_fitness, initial), "improved_on_initial": improved,
            "forward_s": round(fitness.forward_seconds, 3),
        }
    return snapshots


def search_coefficients(model: torch.nn.Module, dm: ClassificationDataModule, local: ElasticScores,
                        settings: Settings) -> tuple[torch.Tensor, dict[str, Any]]:
    """xNES with the settings' evaluation budget: (coefficients, search stats)."""
    budget = settings.search["max_evaluations"]
    stats = search_snapshots(model, dm, local, settings.search, [budget])[budget]
    return stats.pop("coefficients"), stats


def subnet_key(subnet) -> tuple:
    return tuple(tuple(sorted(h.tolist())) for h in subnet.heads) + tuple(tuple(sorted(n.tolist())) for n in subnet.neurons)


def run(settings: Settings, out_prefix: Path, threads: Optional[int], quick: bool = False,
        reference: Path = REFERENCE) -> dict[str, Any]:
    log = Progress()
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(settings.seed)
    model, spec, model_info = load_reference(reference)
    model.eval()
    log(f"model: {model_info['source']}" + (f"  WARNING: {model_info['warning']}" if "warning" in model_info else ""))
    timings: dict[str, Any] = {"scoring_s": {}, "evaluation_s": {}}

    started = time.perf_counter()
    dm = ClassificationDataModule(**dict(settings.data, seed=settings.seed))
    dm.configure_for_model(model)
    data = build_data(model, METRICS, dm.source, dm.root, settings.knn_train, settings.knn_val, settings.eval_batch,
                      seg_train_samples=settings.seg_train, seg_val_samples=settings.seg_val, seed=settings.seed, cache=True)
    timings["data_s"] = time.perf_counter() - started
    log(f"evaluation data cached: {settings.knn_train}/{settings.knn_val} classification, "
        f"{settings.seg_train}/{settings.seg_val} segmentation images ({timings['data_s']:.1f}s)")

    def evaluate(m: torch.nn.Module, label: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        result = evaluate_model(m, data, METRICS, settings.knn_k, settings.seg_epochs, settings.throughput_batch,
                                settings.throughput_repeats, device="cpu")
        timings["evaluation_s"][label] = time.perf_counter() - t0
        log(f"evaluated {label}: " + ", ".join(f"{k} {result[k]:.3f}" for k, _ in REPORTED if k in result)
            + f", {result['throughput_images_per_s']:.0f} img/s ({timings['evaluation_s'][label]:.1f}s)")
        return result

    dense = evaluate(model, "dense")
    cost = CostModel(model)
    base, base_fingerprint = spec.to_dict(), fingerprint(model)
    blocks = len(cost.num_heads)
    scorers = sorted({METHODS[m][0] for m in settings.methods}, key=list(METHODS).index)
    if "label_fisher" in scorers and not getattr(model, "num_classes", 0):
        raise SystemExit("label_fisher needs a classifier head; drop it from --methods")
    locals_: dict[str, LocalScores] = {}
    for name in scorers:
        t0 = time.perf_counter()
        locals_[name] = local_scores(name, model, dm, settings)
        timings["scoring_s"][name] = time.perf_counter() - t0
        log(f"local scores {name} ({timings['scoring_s'][name]:.1f}s)")

    results: dict[str, Any] = {}
    evaluated: dict[tuple, dict[str, Any]] = {}  # identical sub-networks are evaluated once
    initial = initial_coefficients(blocks, cost.num_heads, *settings.search["initial_range"])
    for method in settings.methods:
        scorer, searched = METHODS[method]
        local = ElasticScores(locals_[scorer].heads, locals_[scorer].neurons, None, base, base_fingerprint,
                              settings.min_mlp_keep, settings.min_head_keep)
        entry: dict[str, Any] = {"scorer": scorer, "search": None, "pairs": []}
        if searched:
            t0 = time.perf_counter()
            local.coefficients, entry["search"] = search_coefficients(model, dm, local, settings)
            timings["search_s"] = time.perf_counter() - t0
            log(f"xNES search for {method}: {entry['search']['evaluations']} evaluations, fitness "
                f"{entry['search']['initial_fitness']:.4f} -> {entry['search']['best_fitness']:.4f} ({timings['search_s']:.1f}s)")
        elif settings.baseline_coefficients == "initial":
            local.coefficients = initial
        for mlp_ratio, head_ratio in settings.pairs:
            subnet, _, _ = local.subnet(Budget(mlp_ratio=mlp_ratio, head_ratio=head_ratio), cost)
            key = subnet_key(subnet)
            label = f"{method} ({mlp_ratio:.2f}, {head_ratio:.2f})"
            if key in evaluated:
                log(f"{label}: same sub-network as an earlier model, reusing its numbers")
                metrics = evaluated[key]
            else:
                metrics = evaluated[key] = evaluate(prune_(copy.deepcopy(model), subnet), label)
            entry["pairs"].append({"mlp_ratio": mlp_ratio, "head_ratio": head_ratio, "heads": subnet.head_counts,
                                   "mlp_hidden": subnet.neuron_counts, **metrics})
        results[method] = entry

    timings["total_s"] = time.perf_counter() - log.start
    report = {
        "benchmark": "benchmarks/compare_methods.py", "quick": quick,
        "model": {**model_info, **base, "params": dense["params"], "flops": dense["flops"]},
        "settings": asdict(settings), "machine": machine_info(),
        "timings_s": round_floats(timings), "dense": dense, "methods": results,
    }
    report["summary"] = summarise(report)
    report["name"] = out_prefix.name
    write_outputs(report, out_prefix)
    log(f"wrote {out_prefix}.md/.json/.png (total {timings['total_s']:.1f}s)")
    return report


def machine_info() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average_1m_at_end": load[0] if load else None, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M")}


def round_floats(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: round_floats(v) for k, v in value.items()}
    return value


# -- summary, tables, plot ------------------------------------------------------------------------------
def summarise(report: dict[str, Any]) -> dict[str, Any]:
    """Per metric: where ``ours`` is best, its mean gap to the best other method, its worst loss; and the search's gain."""
    methods = report["methods"]
    if "ours" not in methods:
        return {}
    pairs = [(p["mlp_ratio"], p["head_ratio"]) for p in methods["ours"]["pairs"]]
    others = [m for m in methods if m != "ours"]
    summary: dict[str, Any] = {}
    for key, _ in REPORTED:
        rows = []
        for i, pair in enumerate(pairs):
            ours = methods["ours"]["pairs"][i].get(key)
            rivals = {m: methods[m]["pairs"][i].get(key) for m in others if methods[m]["pairs"][i].get(key) is not None}
            if ours is None or not rivals:
                continue
            best = max(rivals, key=rivals.get)
            label_free = {m: v for m, v in rivals.items() if m != "label_fisher"}
            rows.append({"pair": pair, "ours": ours, "best_other": best, "best_other_value": rivals[best],
                         "margin": ours - rivals[best],
                         "margin_label_free": ours - max(label_free.values()) if label_free else None,
                         "vs_ssl_fisher": ours - rivals["ssl_fisher"] if "ssl_fisher" in rivals else None})
        if rows:
            summary[key] = {
                "pairs": rows, "wins": sum(r["margin"] >= 0 for r in rows), "of": len(rows),
                "mean_margin": statistics.fmean(r["margin"] for r in rows),
                "mean_margin_label_free": (statistics.fmean(r["margin_label_free"] for r in rows)
                                           if all(r["margin_label_free"] is not None for r in rows) else None),
                "search_gain_mean": (statistics.fmean(r["vs_ssl_fisher"] for r in rows)
                                     if all(r["vs_ssl_fisher"] is not None for r in rows) else None),
            }
    return summary


def pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def markdown(report: dict[str, Any]) -> str:
    methods, dense, settings = report["methods"], report["dense"], report["settings"]
    names = list(methods)
    first = methods[names[0]]["pairs"]
    val_n = settings["knn_val"]
    lines = ["# Pruning methods compared (no retraining)", ""]
    if "warning" in report["model"]:
        lines += [f"> **WARNING:** {report['model']['warning']}.", ""]
    lines += [
        f"`python benchmarks/compare_methods.py{' --quick' if report.get('quick') else ''}`, {report['machine']['date']}, "
        f"{report['machine']['cpu']} ({report['machine']['torch_threads']} torch threads), "
        f"total {report['timings_s']['total_s'] / 60:.1f} min. Raw numbers: `{report['name']}.json`; plot: `{report['name']}.png`.",
        "",
        f"Model: {report['model']['model_name']} from {report['model']['source']}: {dense['params'] / 1e6:.3f}M params, "
        f"{dense['flops'] / 1e6:.1f} MFLOPs/image. Fashion-MNIST; scoring on {settings['scoring_images']} train images "
        f"(batch {settings['scoring_batch']}, multi-crop; labeled plain views for label_fisher); xNES "
        f"{settings['search']['max_evaluations']} evaluations on {settings['search']['num_images']} images, PCA "
        f"{settings['search']['pca_components']}; baselines and ssl_fisher use "
        f"{'the initial coefficients linspace(1.2, 0.8)' if settings['baseline_coefficients'] == 'initial' else 'local scores alone'}. "
        f"k-NN (k={settings['knn_k']}) and linear probe on {settings['knn_train']} balanced train / {val_n} val images; "
        f"own head on the same val images; segmentation probe on {settings['seg_train']}/{settings['seg_val']} Fashion-MNIST "
        f"canvases (SegmentationDataModule defaults: for a 28-px model one item per 28-px canvas, at native resolution), "
        f"{settings['seg_epochs']} epochs. Throughput: batch {settings['throughput_batch']}, CPU, median of "
        f"{settings['throughput_repeats']} forwards (other load on the machine makes it noisy).",
        "",
        f"Accuracies in %, best of each row in bold. With {val_n} val images the standard error of a top-1 near 80% "
        f"is about {100 * math.sqrt(0.8 * 0.2 / val_n):.1f} points: smaller differences are noise.",
        "",
    ]
    header = "| (mlp, head) | params | FLOPs | speedup | " + " | ".join(names) + " |"
    rule = "|---|---:|---:|---:|" + "---:|" * len(names)
    for key, title in REPORTED:
        lines += [f"## {title}", "", header, rule,
                  f"| dense | {dense['params'] / 1e6:.3f}M | {dense['flops'] / 1e6:.1f}M | 1.00x "
                  f"({dense['throughput_images_per_s']:.0f}/s) | " + " | ".join(pct(dense.get(key)) for _ in names) + " |"]
        for i, row in enumerate(first):
            values = [methods[m]["pairs"][i].get(key) for m in names]
            best = max((v for v in values if v is not None), default=None)
            cells = [f"**{pct(v)}**" if v is not None and v == best else pct(v) for v in values]
            lines.append(f"| ({row['mlp_ratio']:.2f}, {row['head_ratio']:.2f}) | {pct(row['params'] / dense['params'])}% "
                         f"| {pct(row['flops'] / dense['flops'])}% | {speedup(methods, i, dense)} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["params / FLOPs: % of dense (identical for every method at a pair); speedup: measured throughput / dense, "
              "median over the methods' models at that pair, next to the FLOPs reduction dense/pruned.", "",
              "## Where ours wins / loses", ""]
    lines += summary_lines(report) or ["(`ours` was not run.)"]
    return "\n".join(lines) + "\n"


def speedup(methods: dict[str, Any], i: int, dense: dict[str, Any]) -> str:
    measured = statistics.median(methods[m]["pairs"][i]["throughput_images_per_s"] for m in methods)
    row = next(iter(methods.values()))["pairs"][i]
    return f"{measured / dense['throughput_images_per_s']:.2f}x (FLOPs {dense['flops'] / row['flops']:.2f}x)"


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    search = (report["methods"].get("ours") or {}).get("search")
    if search:
        lines.append(f"- **Search**: xNES moved the fitness from {search['initial_fitness']:.4f} to {search['best_fitness']:.4f} in "
                     f"{search['evaluations']} evaluations" + ("." if search["improved_on_initial"] else
                     "; it never beat the initial coefficients, so ours kept them."))
    for key, title in REPORTED:
        s = report["summary"].get(key)
        if not s:
            continue
        losses = [r for r in s["pairs"] if r["margin"] < 0]
        worst = min(s["pairs"], key=lambda r: r["margin"])
        best = max(s["pairs"], key=lambda r: r["margin"])
        details = []
        if best["margin"] > 0:
            details.append(f"largest lead {100 * best['margin']:+.1f} at {tuple(best['pair'])} over {best['best_other']}")
        if losses:
            details.append(f"largest loss {100 * worst['margin']:+.1f} at {tuple(worst['pair'])} to {worst['best_other']}")
        text = (f"- **{title}**: ours is best (or tied) at {s['wins']} of {s['of']} pairs; mean margin to the best other "
                f"method {100 * s['mean_margin']:+.1f} points" + (f" ({'; '.join(details)})." if details else "."))
        if s["mean_margin_label_free"] is not None and "label_fisher" in report["methods"]:
            text += f" Against the label-free baselines only: {100 * s['mean_margin_label_free']:+.1f} points on average."
        if s["search_gain_mean"] is not None:
            text += f" The xNES search adds {100 * s['search_gain_mean']:+.1f} points on average over ssl_fisher alone."
        lines.append(text)
    dense, methods = report["dense"], report["methods"]
    if lines and methods:
        i = len(next(iter(methods.values()))["pairs"]) - 1
        row = next(iter(methods.values()))["pairs"][i]
        measured = statistics.median(methods[m]["pairs"][i]["throughput_images_per_s"] for m in methods)
        ratio = (measured / dense["throughput_images_per_s"]) / (dense["flops"] / row["flops"])
        lines.append(f"- **Speed**: at the sparsest pair the measured CPU speedup is {speedup(methods, i, dense)}: "
                     f"{100 * ratio:.0f}% of the FLOPs reduction turns into throughput.")
    return lines


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dense = report["dense"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for ax, (key, title) in zip(axes.flat, REPORTED):
        for method, entry in report["methods"].items():
            points = [(100 * (1 - p["params"] / dense["params"]), 100 * p[key]) for p in entry["pairs"] if p.get(key) is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=method, linewidth=2.5 if method == "ours" else 1.2,
                        zorder=3 if method == "ours" else 2)
        if dense.get(key) is not None:
            ax.axhline(100 * dense[key], color="gray", linestyle="--", linewidth=1, label="dense")
        ax.set(title=title, ylabel="%")
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("parameters removed (%)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"{report['model']['model_name']} on Fashion-MNIST, no retraining"
                 + (" (RANDOM WEIGHTS)" if not report["model"]["reference"] else ""))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(report: dict[str, Any], prefix: Path) -> None:
    write_json_atomic(prefix.with_suffix(".json"), report)
    write_text_atomic(prefix.with_suffix(".md"), markdown(report))
    plot(report, prefix.with_suffix(".png"))


# -- run-time estimate from a quick run --------------------------------------------------------------
def estimate_full(report: dict[str, Any], full: Settings) -> dict[str, float]:
    """Rough seconds of a full run: each stage of the quick run scaled by its amount of work."""
    quick, t = report["settings"], report["timings_s"]
    pruned = [p for entry in report["methods"].values() for p in entry["pairs"]] or [report["dense"]]
    stage = lambda name: statistics.fmean(p["timings_s"].get(name, 0.0) for p in pruned)  # noqa: E731
    seg_work = lambda s: s["seg_train"] * (s["seg_epochs"] + 1) + s["seg_val"]  # noqa: E731
    thr_work = lambda s: s["throughput_repeats"] + max(1, s["throughput_repeats"] // 4)  # noqa: E731
    per_model = (stage("classification") * (full.knn_train + 2 * full.knn_val) / (quick["knn_train"] + 2 * quick["knn_val"])
                 + stage("seg") * seg_work(asdict(full)) / seg_work(quick)
                 + stage("throughput") * thr_work(asdict(full)) / thr_work(quick))
    scorers = {METHODS[m][0] for m in full.methods} & {"ssl_fisher", "label_fisher", "snip_magnitude"}
    scoring = max(t["scoring_s"].values()) * full.scoring_images / quick["scoring_images"] * len(scorers)
    search = t.get("search_s", 0.0) * (full.search["max_evaluations"] * full.search["num_images"]) / (
        quick["search"]["max_evaluations"] * quick["search"]["num_images"])
    data = t["data_s"] * (full.knn_train + full.knn_val) / (quick["knn_train"] + quick["knn_val"])
    models = len(full.methods) * len(full.pairs) + 1
    return {"data_s": data, "scoring_s": scoring, "search_s": search, "evaluation_s": per_model * models,
            "models": models, "total_s": data + scoring + search + per_model * models}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, 2 pairs, 2 methods, 6 xNES evaluations")
    parser.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--baseline-coefficients", choices=["initial", "none"], default="initial",
                        help="coefficients of the methods without search: the search's initial mean (as prune.py with "
                             "max_evaluations 0; default) or none (local scores alone)")
    parser.add_argument("--knn-train", type=int, default=None, help="k-NN memory / probe train images (default 10000)")
    parser.add_argument("--knn-val", type=int, default=None, help="scored val images (default 5000)")
    parser.add_argument("--evaluations", type=int, default=None, help="xNES evaluations of ours (default: demo.yaml's, 50)")
    parser.add_argument("--model", default=str(REFERENCE),
                        help="the dense model, a pruned-checkpoint directory (default assets/reference_vit_fmnist; if missing, "
                             "the demo config's architecture with random weights)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's choice; use 1 when other jobs share the CPUs)")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/compare_methods[_quick])")
    args = parser.parse_args()
    settings = replace(Settings.from_demo(args.quick), baseline_coefficients=args.baseline_coefficients)
    for name in ("knn_train", "knn_val"):
        if getattr(args, name) is not None:
            setattr(settings, name, getattr(args, name))
    if args.evaluations is not None:
        settings.search = dict(settings.search, max_evaluations=args.evaluations)
    if args.methods:
        unknown = set(args.methods.split(",")) - set(METHODS)
        if unknown:
            parser.error(f"unknown methods {sorted(unknown)}; choose from {','.join(METHODS)}")
        settings.methods = args.methods.split(",")
    prefix = Path(args.out) if args.out else RESULTS / ("compare_methods_quick" if args.quick else "compare_methods")
    report = run(settings, prefix, args.threads, args.quick, Path(args.model))
    if args.quick:
        estimate = estimate_full(report, Settings.from_demo())
        search = f"{estimate['search_s']:.0f}s" if "search_s" in report["timings_s"] else "not measured (ours not run)"
        print(f"rough full-run estimate from this quick run: {estimate['total_s'] / 60:.1f} min "
              f"(data {estimate['data_s']:.0f}s, scoring {estimate['scoring_s']:.0f}s, search {search}, "
              f"evaluation {estimate['evaluation_s']:.0f}s for {estimate['models']} models)")


if __name__ == "__main__":
    main()
