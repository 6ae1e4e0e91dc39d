"""SnapViT (ours) against the baseline scorers at the paper's pairs, on the development models, over seeds.

    python benchmarks/compare_methods.py --threads 1                        # the full run (see --help for sizes)
    python benchmarks/compare_methods.py --split holdout --seeds 0,1,2       # for choosing defaults: never the test split
    python benchmarks/compare_methods.py --quick                            # smoke run (about a minute)

Every method runs through the pipeline ``prune.py`` runs (:mod:`snapvit_pl.pipeline`), with the
settings of ``configs/prune/demo.yaml`` read by ``prune.py``'s own parser; a seed sets the pruning
data subset, its multi-crop views and the search seed, as ``--data.init_args.seed`` and
``--search.seed`` do. Methods (no retraining, no weight correction):

- ``ours``: SSL-Fisher local scores + the coefficient search (the default ``prune.py`` run), cut at each pair;
- ``ours_split``: the same scores, cut at each pair's parameter count with the head/MLP split chosen by the
  fitness (``export.split: fitness``, what ``prune.py`` does for a sparsity / params / FLOPs budget);
- ``paper_search``: the same local scores with the paper's search (xNES, sigma 1 on the coefficients, default
  population, 50 evaluations; ``SearchSettings.paper()``) on the same fitness images;
- ``ssl_fisher``: the same local scores with the initial coefficients (``search.max_evaluations: 0``);
- ``label_fisher`` (needs labels), ``snip_magnitude``, ``lamp``, ``magnitude``, ``random``: the other scorers,
  with the initial coefficients (``--baseline-coefficients none``: local scores alone);
- ``label_fisher_split``, ``snip_magnitude_split``: those two with the fitness-chosen split of ``ours_split``
  (what the split alone is worth).

``lamp`` and ``magnitude`` read only the weights: they run once, whatever the seeds. Each pruned model
gets own-head, linear-probe and weighted k-NN top-1 on ``--val-samples`` images of the test split
(``--split test``, default: all 10 000) or of a held-out part of the train split disjoint from the
k-NN memory (``--split holdout``: what defaults are chosen on). Writes
``benchmarks/results/compare_methods[_<split>].{md,json,png}`` (``--quick``: ``compare_methods_quick.*``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import torch
from torch.utils.data import DataLoader, Subset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    MODELS, RESULTS, Progress, PruneSetup, display, machine_info, model_overrides, pct, prune_setup, rounded,
)
from snapvit_pl.data.base import balanced_subset_indices, dataset_targets  # noqa: E402
from snapvit_pl.elastic import PAPER_PAIRS, Budget, CostModel, ElasticScores, initial_coefficients  # noqa: E402
from snapvit_pl.eval.suite import EvalData  # noqa: E402
from snapvit_pl.io import write_json_atomic, write_text_atomic  # noqa: E402
from snapvit_pl.models import fingerprint  # noqa: E402
from snapvit_pl.pipeline import (  # noqa: E402
    Evaluation, EvaluationSettings, SearchSettings, choose_splits, extract_models, local_importance, run_search,
    scoring_views, split_table,
)
from snapvit_pl.scoring import build_scorer  # noqa: E402

METHODS = {  # name -> (scorer, search: False / "default" / "paper", uses the data)
    "ours": ("ssl_fisher", "default", True), "ours_split": ("ssl_fisher", "default", True),
    "paper_search": ("ssl_fisher", "paper", True), "ssl_fisher": ("ssl_fisher", False, True),
    "label_fisher": ("label_fisher", False, True), "snip_magnitude": ("snip_magnitude", False, True),
    "lamp": ("lamp", False, False), "magnitude": ("magnitude", False, False), "random": ("random", False, True),
    # the baselines given our fitness-chosen split too (what the split alone is worth)
    "label_fisher_split": ("label_fisher", False, True), "snip_magnitude_split": ("snip_magnitude", False, True),
}
REPORTED = [("head_top1", "own-head top-1"), ("linear_top1", "linear-probe top-1"), ("knn_top1", "k-NN top-1")]
RIVALS = ("snip_magnitude", "label_fisher")  # the baselines the goal names
DEFAULT_METHOD = "ours_split"  # what python prune.py does (drawn bold)
EVALUATION_SEED = 0  # data seed of the k-NN memory / probe subset (and the holdout), whatever the seeds measured


@dataclass
class Settings:
    models: list[str] = field(default_factory=lambda: list(MODELS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    pairs: list[tuple[float, float]] = field(default_factory=lambda: list(PAPER_PAIRS))
    split: str = "test"
    train_samples: int = 10000
    val_samples: Optional[int] = None  # None: the whole split (test: 10 000 images)
    baseline_coefficients: str = "initial"
    overrides: list[str] = field(default_factory=list)  # extra prune.py overrides (e.g. search settings)

    def quick(self) -> "Settings":
        methods = ["ours", "ours_split", "magnitude"] if self.methods == list(METHODS) else self.methods
        return replace(self, models=self.models[:1], seeds=[0], methods=methods, pairs=[PAPER_PAIRS[3]],
                       train_samples=300, val_samples=200,
                       overrides=self.overrides + ["--data.init_args.max_samples=64", "--search.max_evaluations=4",
                                                   "--search.num_images=64", "--search.pca_components=16"])


def evaluation_data(setup: PruneSetup, settings: Settings, batch_size: int = 256) -> EvalData:
    """k-NN memory / probe train set from the train split; scored images from the test split, or from a holdout of
    the train split disjoint from the k-NN memory and from the pruning images."""
    dm = setup.datamodule
    memory = dm.labeled_dataloader("train", settings.train_samples, batch_size)
    if settings.split == "test":  # (None would mean the DataModule's own max_samples: ask for the whole split)
        scored = dm.labeled_dataloader("val", settings.val_samples or len(dm.base_dataset("val")), batch_size)
    else:
        base = dm.base_dataset("train")
        pruning = dm.dataset("train")  # the images the methods score with (labels too, for label_fisher)
        taken = {i for d in (memory.dataset.dataset, pruning) if isinstance(d, Subset) for i in d.indices}
        holdout = balanced_subset_indices(len(base), dataset_targets(base), settings.val_samples or 10000, seed=12345,
                                          keep=lambda i: i not in taken)
        scored = DataLoader(Subset(dm.labeled_dataset("train", len(base)), holdout), batch_size=batch_size)  # whole split
    return EvalData(train=list(memory), val=list(scored), num_classes=dm.num_classes)


class CachedEvaluation(Evaluation):
    """Evaluates each distinct pruned model once (identical sub-networks from different methods)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.cache: dict[str, dict[str, Any]] = {}

    def __call__(self, model: torch.nn.Module) -> dict[str, Any]:
        key = fingerprint(model)
        if key not in self.cache:
            self.cache[key] = super().__call__(model)
        return self.cache[key]


def method_scores(method: str, setup: PruneSetup, seed: int, coefficients: str, log: Progress,
                  shared: dict[str, Any]) -> tuple[ElasticScores, dict[str, Any]]:
    """The elastic scores of one method, computed as prune.py computes them; SSL-Fisher scores are shared."""
    name, searched, _ = METHODS[method]
    info: dict[str, Any] = {}
    started = time.perf_counter()
    if name not in shared:
        config_scorer = setup.importance.scorer
        kwargs = {"snip_magnitude": {"n_global": getattr(config_scorer, "n_global", 2)}, "random": {"seed": seed}}.get(name, {})
        scorer = config_scorer if name == config_scorer.name else build_scorer(name, **kwargs)
        dm = setup.datamodule
        dm.train_views = scoring_views(scorer)
        shared[name] = local_importance(scorer, setup.model, dm.train_dataloader() if scorer.requires_data else [])
        info["scoring_s"] = time.perf_counter() - started
    local = shared[name]
    blocks = len(local.heads)
    scores = ElasticScores(local.heads, local.neurons, None, setup.spec.to_dict(), fingerprint(setup.model),
                           setup.importance.min_mlp_keep, setup.importance.min_head_keep)
    if searched and f"search/{searched}" in shared:
        scores.coefficients, info["search"] = shared[f"search/{searched}"]
    elif searched:
        started = time.perf_counter()
        images = setup.datamodule.unlabeled_images(setup.search.num_images, setup.search.batch_size)
        search = setup.search if searched == "default" else SearchSettings.paper(
            seed=setup.search.seed, num_images=setup.search.num_images, batch_size=setup.search.batch_size,
            pca_components=setup.search.pca_components, sparsity_pairs=setup.search.sparsity_pairs)
        result = run_search(setup.model, images, scores, search)
        scores.coefficients = result.coefficients
        shared[f"search/{searched}"] = (result.coefficients, result.summary())
        info.update(search=result.summary(), search_s=time.perf_counter() - started)
        log(f"  search: {result.evaluations} evaluations, fitness {result.initial_fitness:.4f} -> "
            f"{result.best_fitness:.4f} ({info['search_s']:.1f}s)")
    elif coefficients == "initial":
        scores.coefficients = initial_coefficients(blocks, [len(h) for h in local.heads], *setup.search.initial_range)
    return scores, info


def run(settings: Settings, out_prefix: Path, threads: Optional[int], quick: bool) -> dict[str, Any]:
    log = Progress()
    if threads:
        torch.set_num_threads(threads)
    budgets = [Budget(mlp_ratio=m, head_ratio=h) for m, h in settings.pairs]
    report: dict[str, Any] = {"benchmark": "benchmarks/compare_methods.py", "quick": quick, "name": out_prefix.name,
                              "settings": asdict(settings), "models": {}}
    for model_name in settings.models:
        entry: dict[str, Any] = {"rows": [], "runs": []}
        evaluation, dense_done = None, False
        for seed in settings.seeds:
            setup = prune_setup(*model_overrides(model_name), f"--data.init_args.seed={seed}", f"--search.seed={seed}",
                                *settings.overrides)
            if evaluation is None:  # the same evaluation images whatever the seeds (runs over other seeds can merge)
                started = time.perf_counter()
                metrics = EvaluationSettings(metrics=["knn", "linear", "head"], train_samples=settings.train_samples,
                                             val_samples=settings.val_samples)
                eval_setup = setup if seed == EVALUATION_SEED else prune_setup(
                    *model_overrides(model_name), f"--data.init_args.seed={EVALUATION_SEED}", *settings.overrides)
                evaluation = CachedEvaluation(metrics, evaluation_data(eval_setup, settings), device=torch.device("cpu"))
                entry["data_s"] = time.perf_counter() - started
                entry["search_settings"] = setup.search.to_dict()
                entry["scorer"] = setup.importance.scorer_record()
            if not dense_done:
                entry["dense"] = {"params": sum(p.numel() for p in setup.model.parameters()), **evaluation(setup.model)}
                dense_done = True
                log(f"{model_name}: dense " + ", ".join(f"{name} {pct(entry['dense'][k])}" for k, name in REPORTED))
            shared: dict[str, Any] = {}
            cost = CostModel(setup.model)
            for method in settings.methods:
                if not METHODS[method][2] and seed != settings.seeds[0]:
                    continue  # weights only: the same for every seed
                scores, info = method_scores(method, setup, seed, settings.baseline_coefficients, log, shared)
                started = time.perf_counter()
                method_budgets = budgets
                if method.endswith("_split"):  # each pair's parameter count, split by the fitness
                    method_budgets = [Budget(params=cost.params(scores.subnet(b, cost)[0])) for b in budgets]
                    images = setup.datamodule.unlabeled_images(setup.search.num_images, setup.search.batch_size)
                    choices = choose_splits(setup.model, images, scores, method_budgets, setup.search,
                                            replace(setup.export, split_grid=0), cost)  # the budgets only, no grid
                    scores.splits = split_table(choices)
                    info["splits"] = [asdict(c) for c in choices]
                items = extract_models(setup.model, scores, method_budgets, evaluation=evaluation, cost=cost)
                entry["runs"].append({"method": method, "seed": seed, **info, "evaluation_s": time.perf_counter() - started})
                for pair, item in zip(settings.pairs, items):
                    entry["rows"].append({"method": method, "seed": seed, "pair": list(pair),
                                          "ratios": [item.mlp_ratio, item.head_ratio],
                                          "params": item.params, "flops": item.flops, "heads": item.subnet.head_counts,
                                          "mlp_hidden": item.subnet.neuron_counts,
                                          **{k: item.metrics.get(k) for k, _ in REPORTED}})
                log(f"{model_name} seed {seed} {method}: " + "; ".join(
                    f"{tuple(r['pair'])} " + "/".join(pct(r[k]) for k, _ in REPORTED)
                    for r in entry["rows"][-len(items):]))
                entry["summary"] = aggregate(entry["rows"])
                report["models"][model_name] = entry
                write_report(report, out_prefix, log, partial=True)  # what is measured so far survives an interruption
    write_report(report, out_prefix, log, partial=False)
    log(f"wrote {display(out_prefix)}.md/.json/.png (total {report['total_s'] / 60:.1f} min)")
    return report


def write_report(report: dict[str, Any], out_prefix: Path, log: Optional[Progress], partial: bool) -> None:
    """The JSON, Markdown and plot of ``report`` (``partial``: a run still in progress, marked as such)."""
    report["partial"] = partial
    if log is not None:  # (a merge keeps the runs' own machine and times)
        report["machine"] = machine_info()
        report["total_s"] = time.perf_counter() - log.start
    report["goal"] = goal(report)
    write_json_atomic(out_prefix.with_suffix(".json"), rounded(report))
    write_text_atomic(out_prefix.with_suffix(".md"), markdown(report))
    plot(report, out_prefix.with_suffix(".png"))


def merge(paths: list[Path], out_prefix: Path) -> dict[str, Any]:
    """One report from the reports of finished runs over different models or different seeds of a model (e.g. one
    process per model, or per group of seeds, in parallel). A (model, method, seed) must come from one run only, and
    the runs of a model must agree on its dense model and its settings."""
    reports = [json.loads(Path(p).read_text()) for p in paths]  # (an interrupted run holds its finished methods)
    models: dict[str, dict[str, Any]] = {}
    for report in reports:
        for name, entry in report["models"].items():
            if name not in models:
                models[name] = {**entry, "rows": list(entry["rows"]), "runs": list(entry["runs"])}
                continue
            merged = models[name]
            if _measured(merged["dense"]) != _measured(entry["dense"]) or _measured(merged["search_settings"]) != \
                    _measured(entry["search_settings"]):
                raise ValueError(f"the runs of {name} disagree on the dense model or the search settings")
            have = {(r["method"], r["seed"]) for r in merged["runs"]}
            again = sorted(f"{r['method']} seed {r['seed']}" for r in entry["runs"] if (r["method"], r["seed"]) in have)
            if again:
                raise ValueError(f"{name}: {', '.join(again)} measured by more than one run")
            merged["rows"] += entry["rows"]
            merged["runs"] += entry["runs"]
    for entry in models.values():
        entry["summary"] = aggregate(entry["rows"])
    methods = list(dict.fromkeys(m for r in reports for m in r["settings"]["methods"]))
    seeds = sorted({s for r in reports for s in r["settings"]["seeds"]})
    merged_report = {**reports[0], "name": out_prefix.name, "models": models,
                     "merged_from": [display(Path(p)) + (" (interrupted: its finished methods)" if r.get("partial") else "")
                                     for p, r in zip(paths, reports)],
                     "total_s": sum(r["total_s"] for r in reports)}
    merged_report["settings"] = {**reports[0]["settings"], "models": list(models), "methods": methods, "seeds": seeds}
    write_report(merged_report, out_prefix, None, partial=False)
    print(f"wrote {display(out_prefix)}.md/.json/.png from {len(paths)} reports")
    return merged_report


def _measured(record: dict[str, Any]) -> dict[str, Any]:
    """What runs over other seeds must share: a record without its timings and its seed."""
    return {k: v for k, v in record.items() if k not in ("timings_s", "seed")}


def aggregate(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{method: {"m,h": {metric: {"mean", "std", "n", "values"}, "params": ...}}}`` over seeds."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        cell = out.setdefault(row["method"], {}).setdefault(_key(row["pair"]), {"params": row["params"], "values": {}})
        for key, _ in REPORTED:
            cell["values"].setdefault(key, []).append(row[key])
    for cells in out.values():
        for cell in cells.values():
            for key, values in cell.pop("values").items():
                cell[key] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                             "n": len(values), "values": values}
    return out


def _key(pair) -> str:
    return f"{pair[0]:.2f},{pair[1]:.2f}"


def goal(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 13's goal: ours >= SNIP-magnitude and label Fisher on own-head and linear top-1 at every pair
    from ~30% sparsity (the four sparsest paper pairs), on every development model (means over seeds).
    Checked for ``ours`` (the pairs) and ``ours_split`` (their parameter counts, fitness-chosen splits)."""
    out: dict[str, Any] = {}
    for method in ("ours", "ours_split"):
        checks = []
        for model_name, entry in report["models"].items():
            summary = entry["summary"]
            if method not in summary:
                continue
            for pair in list(summary[method])[-4:]:
                for key in ("head_top1", "linear_top1"):
                    ours = summary[method][pair][key]["mean"]
                    for rival in RIVALS:
                        if rival in summary and pair in summary[rival]:
                            checks.append({"model": model_name, "pair": pair, "metric": key, "rival": rival,
                                           "margin": ours - summary[rival][pair][key]["mean"]})
        if checks:
            out[method] = {"met": all(c["margin"] >= 0 for c in checks), "checks": checks}
    return out


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = ["# Pruning methods compared (no retraining, no correction)", "",
             f"`python benchmarks/compare_methods.py{' --quick' if report['quick'] else ''} --split {s['split']}`, "
             f"{report['machine']['date']}, {report['machine']['cpu']} ({report['machine']['torch_threads']} torch "
             f"thread(s)), {report['total_s'] / 60:.0f} min. Raw numbers: `{report['name']}.json`; plot: `{report['name']}.png`.",
             "",
             *(["**Unfinished run: the numbers so far.**", ""] if report.get("partial") else []),
             *([f"Merged from {len(report['merged_from'])} runs (over models or seeds, run in parallel, one torch thread "
                "each; `--merge`): " + "; ".join(f"`{p}`" for p in report["merged_from"]) + ". The time is their sum.", ""]
              if report.get("merged_from") else []),
             f"Every method through the `prune.py` pipeline with the settings of `configs/prune/demo.yaml`; seeds "
             f"{s['seeds']} (pruning subset, crops and search seed); `lamp` and `magnitude` use no data and run once. "
             f"Scored on {'the test split' if s['split'] == 'test' else 'a held-out part of the train split'} "
             f"({s['val_samples'] or 'all'} images); k-NN memory and probe training set: {s['train_samples']} train images. "
             "Top-1 in %, mean ± standard deviation over the seeds; the best mean of each row in bold.", ""]
    for model_name, entry in report["models"].items():
        summary, dense = entry["summary"], entry["dense"]
        names = [m for m in s["methods"] if m in summary]
        lines += [f"## {model_name} ({display(MODELS[model_name])}: {dense['params'] / 1e6:.2f}M params)", ""]
        for key, title in REPORTED:
            lines += [f"### {title} (dense {pct(dense[key])})", "",
                      "| (mlp, head) | params | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
            for pair in summary[names[0]]:
                cells = [summary[m].get(pair, {}).get(key) for m in names]
                best = max((c["mean"] for c in cells if c), default=None)
                text = [("**{}**" if c and c["mean"] == best else "{}").format(_cell(c, len(s["seeds"]))) for c in cells]
                params = summary[names[0]][pair]["params"] / dense["params"]
                lines.append(f"| ({pair}) | {pct(params, 0)}% | " + " | ".join(text) + " |")
            lines.append("")
    for method, result in report["goal"].items():
        checks = result["checks"]
        lines += [f"## Goal: {method} >= SNIP-magnitude and label Fisher (own head, linear), pairs from ~30% sparsity", "",
                  f"**{'Met' if result['met'] else 'Not met'}** "
                  f"({sum(c['margin'] >= 0 for c in checks)} of {len(checks)} comparisons). Where it loses:", ""]
        losses = [c for c in checks if c["margin"] < 0]
        lines += [f"- {c['model']} ({c['pair']}) {c['metric']}: {100 * c['margin']:+.2f} points vs {c['rival']}"
                  for c in losses] or ["- nowhere."]
        lines.append("")
    return "\n".join(lines)


def _cell(cell: Optional[dict[str, Any]], seeds: int) -> str:
    if not cell:
        return "n/a"
    return (f"{100 * cell['mean']:.2f}" + (f" ± {100 * cell['std']:.2f}" if cell["n"] > 1 else "")
            + (f" (n={cell['n']})" if cell["n"] != seeds else ""))  # fewer seeds than the others (e.g. weights-only)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    fig, axes = plt.subplots(len(models), len(REPORTED), figsize=(5 * len(REPORTED), 4 * len(models)), squeeze=False)
    for row, (model_name, entry) in enumerate(models.items()):
        dense = entry["dense"]
        for ax, (key, title) in zip(axes[row], REPORTED):
            for method, cells in entry["summary"].items():
                xs = [100 * (1 - c["params"] / dense["params"]) for c in cells.values()]
                ys = [100 * c[key]["mean"] for c in cells.values()]
                errors = [100 * c[key]["std"] for c in cells.values()]
                ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=method,
                            linewidth=2.5 if method == DEFAULT_METHOD else 1.2, zorder=3 if method == DEFAULT_METHOD else 2)
            ax.axhline(100 * dense[key], color="gray", linestyle="--", linewidth=1, label="dense")
            ax.set(title=f"{model_name}: {title}", xlabel="parameters removed (%)", ylabel="top-1 (%)")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: the first of --models, one seed, three methods, one pair")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the data subset, crops and search")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--split", choices=["test", "holdout"], default="test",
                        help="score on the test split (results) or on a held-out part of the train split (choosing defaults)")
    parser.add_argument("--val-samples", type=int, default=0, help="scored images (0: the whole test split / 10000)")
    parser.add_argument("--train-samples", type=int, default=10000, help="k-NN memory / probe train images")
    parser.add_argument("--baseline-coefficients", choices=["initial", "none"], default="initial",
                        help="coefficients of the methods without search: the search's initial mean (prune.py with "
                             "max_evaluations 0; default) or none (local scores alone)")
    parser.add_argument("--override", action="append", default=[], help="extra prune.py override, e.g. --search.sigma=0.5")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 on a busy machine)")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/compare_methods[_holdout])")
    parser.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                        help="merge the reports of finished runs over different --models into --out, then exit")
    args = parser.parse_args(argv)
    if args.merge:
        try:
            merge(args.merge, Path(args.out) if args.out else RESULTS / "compare_methods")
        except (OSError, ValueError, KeyError) as err:
            parser.error(f"cannot merge: {err}")
        return
    settings = Settings(models=args.models.split(","), seeds=[int(s) for s in args.seeds.split(",")],
                        methods=args.methods.split(","), split=args.split, train_samples=args.train_samples,
                        val_samples=args.val_samples or None, baseline_coefficients=args.baseline_coefficients,
                        overrides=args.override)
    for name, known in (("models", MODELS), ("methods", METHODS)):
        unknown = set(getattr(settings, name)) - set(known)
        if unknown:
            parser.error(f"unknown {name} {sorted(unknown)}; choose from {','.join(known)}")
    if args.quick:
        settings = settings.quick()
    suffix = "_quick" if args.quick else ("" if args.split == "test" else f"_{args.split}")
    prefix = Path(args.out) if args.out else RESULTS / f"compare_methods{suffix}"
    run(settings, prefix, args.threads, args.quick)


if __name__ == "__main__":
    main()
