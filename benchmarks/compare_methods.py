"""Every scorer through the same pipeline, the same head/MLP split machinery and the same correction.

    python benchmarks/compare_methods.py --threads 1                        # the full run (see --help for sizes)
    python benchmarks/compare_methods.py --split holdout --seeds 0,1,2       # for choosing defaults: never the test split
    python benchmarks/compare_methods.py --quick                            # smoke run (about a minute)

Every method runs through the pipeline ``prune.py`` runs (:mod:`snapvit_pl.pipeline`), with the
settings of ``configs/prune/demo.yaml`` read by ``prune.py``'s own parser; a seed sets the pruning
data subset (and the views and probes drawn from it) and the search seed, as ``--data.init_args.seed``
and ``--search.seed`` do. Each method's scores are cut at the parameter count of each of the paper's
(mlp, head) pairs, and every method's split of that count between heads and MLP neurons is chosen by
the same fitness on its own scores (``export.split: fitness``, what ``prune.py`` does); ``--cut pairs``
is the ablation that cuts the pairs as given (the fixed schedule). Methods:

- ``ours``: the default ``prune.py`` run (the config's scorer, :class:`GaussNewtonGreedy`, and its search
  settings: no coefficient search); ``sensitivity``: the per-unit :class:`OutputSensitivity` (4 probes), the default
  before issue 38;
- ``snapvit``: SnapViT's own recipe, ``configs/prune/snapvit.yaml``: SSL-Fisher scores and the paper's xNES
  (``SearchSettings.paper()``); ``ssl_fisher_snes``: the same scores with this project's SNES
  (``SearchSettings.snes()``); ``ssl_fisher``: the same scores, no search;
- ``label_fisher`` (needs labels; for a backbone without classifier, the cross-entropy of a linear probe fitted on the
  pruning images' dense embeddings: ``with_probe_head``), ``snip_magnitude``, ``taylor`` (Torch-Pruning's group Taylor with the
  self-supervised loss), ``activation`` (Minitron / ModelOpt), ``wanda_sp``, ``flap``, ``lamp``, ``magnitude``,
  ``random``: the other scorers, with the coefficients ``prune.py`` gives a scorer without search, ranked
  globally across blocks (``importance.allocation: global``);
- ``activation_uniform``, ``wanda_sp_uniform``: Minitron's and Wanda-sp's scores in their published allocation
  (the same share of every block, ``importance.allocation: uniform``); ``flap_standardized``: FLAP's scores
  standardised per block, as published (``importance.allocation: standardized``).

``--correction both`` (default) evaluates every model as cut and after the SparseGPT-style correction
(``--correction.enabled true``, the same calibration images for every method): two tables. ``lamp`` and
``magnitude`` read only the weights: they run once, whatever the seeds. Each pruned model gets own-head,
linear-probe and weighted k-NN top-1 on ``--val-samples`` images of the test split (``--split test``,
default: all 10 000) or of a held-out part of the train split disjoint from the k-NN memory (``--split
holdout``: what defaults are chosen on). Writes ``benchmarks/results/compare_methods[_<split>].{md,json}``
and plots of accuracy against parameters (``.png``) and FLOPs (``_flops.png``).
"""
from __future__ import annotations

import argparse
import copy
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
    MODELS, RESULTS, Progress, PruneSetup, display, machine_info, model_overrides, parse_args, pct, prune_setup,
    write_results,
)
from snapvit_pl.data.sampling import balanced_subset_indices, dataset_targets  # noqa: E402
from snapvit_pl.elastic import PAPER_PAIRS, Budget, CostModel, ElasticScores, initial_coefficients  # noqa: E402
from snapvit_pl.eval.features import extract_features  # noqa: E402
from snapvit_pl.eval.linear_probe import linear_probe  # noqa: E402
from snapvit_pl.eval.suite import EvalData  # noqa: E402
from snapvit_pl.models import fingerprint  # noqa: E402
from snapvit_pl.pipeline import (  # noqa: E402
    Correction, Evaluation, EvaluationSettings, SearchSettings, choose_splits, extract_models, local_importance, run_search,
    scoring_views, split_table,
)
from snapvit_pl.pipeline.importance import match_global_views  # noqa: E402
from snapvit_pl.scoring import build_scorer  # noqa: E402
from snapvit_pl.scoring.base import ScoringContext  # noqa: E402

@dataclass(frozen=True)
class Method:
    """A compared method: its scorer (None: the config's), its coefficient search (None: none, ``config``: the
    config's, ``paper``: ``SearchSettings.paper()``, ``snes``: ``SearchSettings.snes()``), whether it reads data,
    and how its scores are compared across blocks (``importance.allocation``)."""

    scorer: Optional[str]
    search: Optional[str] = None
    uses_data: bool = True
    allocation: str = "global"
    #: the config scorer's arguments this method changes (``ours_stages3``: the greedy re-linearised in 3 stages)
    overrides: tuple[tuple[str, Any], ...] = ()


METHODS = {
    "ours": Method(None, "config"),  # the config's scorer and search: what python prune.py does
    # issue 46: the default score re-linearised in 3 stages (three importance passes; an option, not the default)
    "ours_stages3": Method(None, "config", overrides=(("stages", 3),)),
    "sensitivity": Method("sensitivity"),  # the per-unit Gauss-Newton sensitivity: the default before issue 38
    "snapvit": Method("ssl_fisher", "paper"), "ssl_fisher_snes": Method("ssl_fisher", "snes"),
    "ssl_fisher": Method("ssl_fisher"), "label_fisher": Method("label_fisher"),
    "snip_magnitude": Method("snip_magnitude"), "taylor": Method("taylor"),
    "activation": Method("activation"), "activation_uniform": Method("activation", allocation="uniform"),
    "wanda_sp": Method("wanda_sp"), "wanda_sp_uniform": Method("wanda_sp", allocation="uniform"),
    "flap": Method("flap"), "flap_standardized": Method("flap", allocation="standardized"),
    "lamp": Method("lamp", uses_data=False), "magnitude": Method("magnitude", uses_data=False),
    "random": Method("random"),
}
#: the methods of a full run (``--methods`` for the others)
DEFAULT_METHODS = ("ours", "sensitivity", "snapvit", "ssl_fisher_snes", "ssl_fisher", "label_fisher", "snip_magnitude", "taylor",
                   "activation", "activation_uniform", "wanda_sp", "wanda_sp_uniform", "flap", "flap_standardized")
REPORTED = [("head_top1", "own-head top-1"), ("linear_top1", "linear-probe top-1"), ("knn_top1", "k-NN top-1")]
DEFAULT_METHOD = "ours"  # what python prune.py does (drawn bold)
EVALUATION_SEED = 0  # data seed of the k-NN memory / probe subset (and the holdout), whatever the seeds measured


@dataclass
class Settings:
    models: list[str] = field(default_factory=lambda: list(MODELS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    pairs: list[tuple[float, float]] = field(default_factory=lambda: list(PAPER_PAIRS))
    split: str = "test"
    train_samples: int = 10000
    val_samples: Optional[int] = None  # None: the whole split (test: 10 000 images)
    cut: str = "split"  # split: each pair's parameter count, split by the fitness; pairs: the pairs as given
    correction: str = "both"  # off / on / both: the models as cut, after the correction, or both
    search_evaluations: Optional[int] = None  # evaluations of the paper / snes searches (None: their own)
    overrides: list[str] = field(default_factory=list)  # extra prune.py overrides (e.g. search settings)

    def quick(self) -> "Settings":
        methods = ["ours", "snapvit", GOAL_RIVAL] if self.methods == list(DEFAULT_METHODS) else self.methods
        return replace(self, models=self.models[:1], seeds=[0], methods=methods, pairs=[PAPER_PAIRS[3]],
                       train_samples=300, val_samples=200, search_evaluations=4,
                       overrides=self.overrides + ["--data.init_args.max_samples=64",
                                                   "--search.num_images=64", "--search.pca_components=16",
                                                   "--correction.num_samples=32"])


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


def method_scores(method: str, setup: PruneSetup, log: Progress, shared: dict[str, Any],
                  search_evaluations: Optional[int] = None) -> tuple[ElasticScores, dict[str, Any]]:
    """The elastic scores of one method, computed as prune.py computes them; local scores shared between methods
    (``shared``); ``search_evaluations`` overrides the evaluations of the paper / snes searches."""
    spec = METHODS[method]
    name, searched = spec.scorer, spec.search
    config_scorer = setup.importance.scorer
    name = name or config_scorer.name
    info: dict[str, Any] = {"scorer": name, **dict(spec.overrides)}
    started = time.perf_counter()
    key = name + "".join(f",{k}={v}" for k, v in spec.overrides)  # local scores shared between methods
    if key not in shared:
        kwargs = {"random": {"seed": setup.search.seed}, "sensitivity": {"seed": setup.search.seed}}.get(name, {})
        scorer = config_scorer if name == config_scorer.name else build_scorer(name, **kwargs)
        if spec.overrides:
            scorer = type(scorer)(**{**scorer.config(), **dict(spec.overrides)})
        dm = setup.datamodule
        dm.train_views = scoring_views(scorer)
        # the teacher's inputs: the data's global crops (as prune.py hands them over), and the run's keep ratios
        context = ScoringContext(min_mlp_keep=setup.importance.min_mlp_keep, min_head_keep=setup.importance.min_head_keep,
                                 global_views=match_global_views(dm, scorer) if dm.train_views == "multicrop" else None)
        model = setup.model
        if scorer.requires_labels and not getattr(model, "num_classes", 0):
            model = with_probe_head(setup)  # a backbone without classifier: a linear probe stands in for it
            info["head"] = "linear probe on the pruning images"
        shared[key] = local_importance(scorer, model, dm.train_dataloader() if scorer.requires_data else [], context)
        info["scoring_s"] = time.perf_counter() - started
    local = shared[key].allocated(spec.allocation)
    if spec.allocation != "global":
        info["allocation"] = spec.allocation
    scores = ElasticScores(local.heads, local.neurons, None, setup.spec.to_dict(), fingerprint(setup.model),
                           setup.importance.min_mlp_keep, setup.importance.min_head_keep)
    search = setup.search
    if searched in ("snes", "paper"):
        preset = SearchSettings.snes if searched == "snes" else SearchSettings.paper
        search = preset(seed=search.seed, num_images=search.num_images, batch_size=search.batch_size,
                        pca_components=search.pca_components, sparsity_pairs=search.sparsity_pairs,
                        **({"max_evaluations": search_evaluations} if search_evaluations else {}))
    if searched and search.max_evaluations and f"search/{name}/{searched}" in shared:
        scores.coefficients, info["search"] = shared[f"search/{name}/{searched}"]
    elif searched and search.max_evaluations:
        started = time.perf_counter()
        result = run_search(setup.model, fitness_images(setup, shared), scores, search)
        scores.coefficients = result.coefficients
        shared[f"search/{name}/{searched}"] = (result.coefficients, result.summary())
        info.update(search=result.summary(), search_s=time.perf_counter() - started)
        log(f"  search: {result.evaluations} evaluations, fitness {result.initial_fitness:.4f} -> "
            f"{result.best_fitness:.4f} ({info['search_s']:.1f}s)")
    else:  # what prune.py does without a search: the search's initial coefficients
        scores.coefficients = initial_coefficients(len(local.heads), [len(h) for h in local.heads], *search.initial_range)
    return scores, info


def with_probe_head(setup: PruneSetup) -> torch.nn.Module:
    """A copy of a backbone without classifier, given one: a linear probe fitted on the dense embeddings of the pruning
    images and their labels (the probe's standardisation folded into the weights), so that label Fisher has a
    cross-entropy to differentiate. Its units and their scores are the backbone's: the head is not pruned."""
    dm = setup.datamodule
    features = extract_features(setup.model, dm.labeled_dataloader("train", batch_size=256), device="cpu")
    result = linear_probe(features.embeddings, features.targets, features.embeddings, features.targets,
                          num_classes=dm.num_classes)
    model = copy.deepcopy(setup.model)
    model.reset_classifier(dm.num_classes)
    weight, bias = folded_probe(result.probe)
    with torch.no_grad():
        model.head.weight.copy_(weight)
        model.head.bias.copy_(bias)
    return model.eval()


def folded_probe(probe: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight, bias)`` of one linear layer equal to a :class:`LinearProbe` (standardisation, then linear)."""
    weight = probe.linear.weight / probe.feature_std
    return weight, probe.linear.bias - weight @ probe.feature_mean


def fitness_images(setup: PruneSetup, shared: dict[str, Any]) -> torch.Tensor:
    """The search's fitness images (plain views of the pruning data), decoded once per seed."""
    if "fitness_images" not in shared:
        shared["fitness_images"] = setup.datamodule.unlabeled_images(setup.search.num_images, setup.search.batch_size)
    return shared["fitness_images"]


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
                has_head = bool(getattr(setup.model, "num_classes", 0))  # (the self-supervised model has none)
                metrics = EvaluationSettings(metrics=["knn", "linear", *(["head"] if has_head else [])],
                                             train_samples=settings.train_samples,
                                             val_samples=settings.val_samples)
                eval_setup = setup if seed == EVALUATION_SEED else prune_setup(
                    *model_overrides(model_name), f"--data.init_args.seed={EVALUATION_SEED}", *settings.overrides)
                evaluation = CachedEvaluation(metrics, evaluation_data(eval_setup, settings), device=torch.device("cpu"))
                entry["data_s"] = time.perf_counter() - started
                entry["search_settings"] = setup.search.to_dict()
                entry["scorer"] = setup.importance.scorer_record()
            if not dense_done:
                dense_cost = CostModel(setup.model)
                entry["dense"] = {"params": dense_cost.dense_params, "flops": dense_cost.dense_flops,
                                  **evaluation(setup.model)}
                dense_done = True
                log(f"{model_name}: dense " + ", ".join(f"{name} {pct(entry['dense'][k])}" for k, name in REPORTED
                                                        if entry["dense"].get(k) is not None))
            shared: dict[str, Any] = {}
            cost = CostModel(setup.model)
            corrections = {"off": [False], "on": [True], "both": [False, True]}[settings.correction]
            correction = Correction(setup.correction, setup.datamodule.unlabeled_images(
                setup.correction.num_samples, setup.correction.batch_size)) if True in corrections else None
            for method in settings.methods:
                if not METHODS[method].uses_data and seed != settings.seeds[0]:
                    continue  # weights only: the same for every seed
                scores, info = method_scores(method, setup, log, shared, settings.search_evaluations)
                method_budgets = budgets
                if settings.cut == "split":  # each pair's parameter count, split by the fitness on the method's scores
                    started = time.perf_counter()
                    method_budgets = [Budget(params=cost.params(scores.subnet(b, cost)[0])) for b in budgets]
                    choices = choose_splits(setup.model, fitness_images(setup, shared), scores, method_budgets,
                                            setup.search, replace(setup.export, split_grid=0), cost)  # no grid
                    scores.splits = split_table(choices)
                    info.update(splits=[asdict(c) for c in choices], split_s=time.perf_counter() - started)
                # one pass: a corrected pass evaluates each model as cut too (``metrics_as_cut``), as prune.py does
                started = time.perf_counter()
                items = extract_models(setup.model, scores, method_budgets, evaluation=evaluation, cost=cost,
                                       correction=correction if True in corrections else None)
                entry["runs"].append({"method": method, "seed": seed, "corrected": True in corrections, **info,
                                      "evaluation_s": time.perf_counter() - started})
                for corrected in corrections:
                    for pair, item in zip(settings.pairs, items):
                        metrics = item.metrics if corrected or correction is None else item.metrics_as_cut
                        row = {"method": method, "seed": seed, "corrected": corrected, "pair": list(pair),
                               "ratios": [item.mlp_ratio, item.head_ratio], "params": item.params,
                               "flops": item.flops, "heads": item.subnet.head_counts,
                               "mlp_hidden": item.subnet.neuron_counts, **{k: metrics.get(k) for k, _ in REPORTED}}
                        if corrected:
                            row["correction"] = correction_summary(item.correction)
                        entry["rows"].append(row)
                    log(f"{model_name} seed {seed} {method}{' +correction' if corrected else ''}: " + "; ".join(
                        f"{tuple(r['pair'])} " + "/".join(pct(r[k]) for k, _ in REPORTED)
                        for r in entry["rows"][-len(items):]))
                entry["summary"] = aggregate(entry["rows"])
                report["models"][model_name] = entry
                write_report(report, out_prefix, log, partial=True)  # what is measured so far survives an interruption
    write_report(report, out_prefix, log, partial=False)
    log(f"wrote {display(out_prefix)}.md/.json/.png (total {report['total_s'] / 60:.1f} min)")
    return report


def correction_summary(record: dict[str, Any]) -> dict[str, Any]:
    """What a model's correction kept (the whole model or the model as cut; each block's variant) and its cost."""
    blocks = [b["kept"] for b in record.get("blocks", [])]
    return {"kept": record.get("kept"), "seconds": record.get("seconds"),
            "blocks_kept": {variant: blocks.count(variant) for variant in dict.fromkeys(blocks)},
            **({"output_check": record["output_check"]} if "output_check" in record else {}),
            **({"steps_run": [b["steps_run"] for b in record["reconstruction"]["blocks"]]}
               if "reconstruction" in record else {})}


def write_report(report: dict[str, Any], out_prefix: Path, log: Optional[Progress], partial: bool) -> None:
    """The JSON, Markdown and plot of ``report`` (``partial``: a run still in progress, marked as such)."""
    report["partial"] = partial
    if log is not None:  # (a merge keeps the runs' own machine and times)
        report["machine"] = machine_info()
        report["total_s"] = time.perf_counter() - log.start
    report["goal"] = goal(report)
    write_results(out_prefix, report, markdown, report.get("settings"))
    plot(report, out_prefix.with_suffix(".png"))


#: the settings a model's numbers depend on, kept per model when reports of different sizes are merged
SIZE_SETTINGS = ("split", "val_samples", "train_samples", "cut")


def merge(paths: list[Path], out_prefix: Path, renames: Optional[dict[str, str]] = None,
          mixed_baselines: bool = False) -> dict[str, Any]:
    """One report from the reports of finished runs over different models or different seeds of a model (e.g. one
    process per model, or per group of seeds, in parallel). A (model, method, seed) must come from one run only, and
    the runs of a model must agree on its dense model, its settings and its sizes (each model keeps its own sizes).

    ``renames``: ``{"file.json:old": "new"}``, a method of one report under the name the benchmark now gives it (a
    column renamed since that run, e.g. ``snapvit`` measured when it was SSL-Fisher + SNES); an empty new name drops
    that method of that report (superseded: measured again by another run, e.g. after its default changed).

    The merged report lists every input run with its commit, date and regression baseline (``merged_from``); runs made
    under different baselines computed with different code and are refused unless ``mixed_baselines``, which marks
    them in the table."""
    reports = [json.loads(Path(p).read_text()) for p in paths]  # (an interrupted run holds its finished methods)
    inputs = merge_inputs(paths, reports)
    baselines = sorted({str(i["baseline"]) for i in inputs})
    if len(baselines) > 1 and not mixed_baselines:
        raise ValueError(f"the runs were made under different regression baselines ({', '.join(baselines)}): the "
                         "project computed other numbers between them; measure them again under one, or pass "
                         "--mixed-baselines to merge them marked in the table")
    for path, report in zip(paths, reports):
        mapping = {old.split(":", 1)[1]: new for old, new in (renames or {}).items() if old.split(":", 1)[0] == str(path)}
        dropped = {old for old, new in mapping.items() if not new}
        mapping = {old: new for old, new in mapping.items() if new}
        if dropped:
            report["settings"]["methods"] = [m for m in report["settings"]["methods"] if m not in dropped]
            for entry in report["models"].values():
                entry["rows"] = [r for r in entry["rows"] if r["method"] not in dropped]
                entry["runs"] = [r for r in entry["runs"] if r["method"] not in dropped]
                entry["superseded"] = sorted({*entry.get("superseded", []), *dropped})
        if mapping:
            report["settings"]["methods"] = [mapping.get(m, m) for m in report["settings"]["methods"]]
            for entry in report["models"].values():
                for record in (*entry["rows"], *entry["runs"]):
                    record["method"] = mapping.get(record["method"], record["method"])
                entry["renamed"] = {**entry.get("renamed", {}), **mapping}
    models: dict[str, dict[str, Any]] = {}
    for report in reports:
        for name, entry in report["models"].items():
            sizes = entry.get("sizes") or {k: report["settings"].get(k) for k in SIZE_SETTINGS}
            if name not in models:
                models[name] = {**entry, "rows": list(entry["rows"]), "runs": list(entry["runs"]), "sizes": sizes}
                continue
            if models[name]["sizes"] != sizes:
                raise ValueError(f"the runs of {name} were measured with other sizes: {models[name]['sizes']} != {sizes}")
            merged = models[name]
            if _measured(merged["dense"]) != _measured(entry["dense"]) or _measured(merged["search_settings"]) != \
                    _measured(entry["search_settings"]):
                raise ValueError(f"the runs of {name} disagree on the dense model or the search settings")
            have = {(r["method"], r["seed"], r.get("corrected", False)) for r in merged["runs"]}
            again = sorted(f"{r['method']} seed {r['seed']}" for r in entry["runs"]
                           if (r["method"], r["seed"], r.get("corrected", False)) in have)
            if again:
                raise ValueError(f"{name}: {', '.join(again)} measured by more than one run")
            merged["rows"] += entry["rows"]
            merged["runs"] += entry["runs"]
            if entry.get("superseded"):
                merged["superseded"] = sorted({*merged.get("superseded", []), *entry["superseded"]})
    for entry in models.values():
        entry["summary"] = aggregate(entry["rows"])
    methods = sorted(dict.fromkeys(m for r in reports for m in r["settings"]["methods"]),
                     key=lambda m: DEFAULT_METHODS.index(m) if m in DEFAULT_METHODS else len(DEFAULT_METHODS))
    seeds = sorted({s for r in reports for s in r["settings"]["seeds"]})
    merged_report = {**reports[0], "name": out_prefix.name, "models": models,
                     "merged_from": inputs,
                     "total_s": sum(r["total_s"] for r in reports)}
    merged_report["settings"] = {**reports[0]["settings"], "models": list(models), "methods": methods, "seeds": seeds}
    if len({json.dumps(e["sizes"], sort_keys=True) for e in models.values()}) == 1:
        merged_report["settings"].update(next(iter(models.values()))["sizes"])
    write_report(merged_report, out_prefix, None, partial=False)
    print(f"wrote {display(out_prefix)}.md/.json/.png from {len(paths)} reports")
    return merged_report


def merge_inputs(paths: list[Path], reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What each merged run was: its file, commit, date and regression baseline (None: made before the baseline
    existed), and whether it was interrupted (its finished methods only)."""
    inputs = []
    for path, report in zip(paths, reports):
        record = report.get("provenance") or {}
        inputs.append({"file": display(Path(path)), "commit": (record.get("commit") or "not recorded")[:12],
                       "date": record.get("date") or (report.get("machine") or {}).get("date"),
                       "baseline": record.get("baseline"), "partial": bool(report.get("partial"))})
    return inputs


def merged_from_table(inputs: list[Any]) -> list[str]:
    """The Markdown lines that list a merged report's input runs (a run whose baseline is not the most common one
    marked)."""
    if inputs and isinstance(inputs[0], str):  # (a report merged before the inputs were recorded)
        return [f"Merged from {len(inputs)} runs: " + "; ".join(f"`{p}`" for p in inputs) + ".", ""]
    baselines = [str(i["baseline"]) for i in inputs]
    usual = max(set(baselines), key=baselines.count)
    lines = [f"Merged from {len(inputs)} runs (over models or seeds, run in parallel, one torch thread each; "
             "`--merge`; the time is their sum), each with the commit it ran at and the regression baseline it was "
             "made under (`-`: before the baseline existed):", "", "| run | commit | date | baseline |", "|---|---|---|---|"]
    for item in inputs:
        baseline = item["baseline"] or "-"
        if str(item["baseline"]) != usual:
            baseline = f"**{baseline} (another baseline)**"
        lines.append(f"| `{item['file']}`{' (interrupted: its finished methods)' if item['partial'] else ''} | "
                     f"{item['commit']} | {item['date'] or '-'} | {baseline} |")
    return lines + [""]


def _measured(record: dict[str, Any]) -> dict[str, Any]:
    """What runs over other seeds must share: a record without its timings, its seed and its batch size (how the
    fitness images are batched: speed and memory, not what is measured)."""
    return {k: v for k, v in record.items() if k not in ("timings_s", "seed", "batch_size")}


def aggregate(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{method: {"m,h": {metric: {"mean", "std", "n", "values"}, "params": ...}}}`` over seeds."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        cell = out.setdefault(column(row["method"], row.get("corrected", False)), {}).setdefault(
            _key(row["pair"]), {"params": row["params"], "flops": row["flops"], "values": {}})
        for key, _ in REPORTED:
            if row.get(key) is not None:  # (a model without a classifier has no own-head accuracy)
                cell["values"].setdefault(key, []).append(row[key])
    for cells in out.values():
        for cell in cells.values():
            for key, values in cell.pop("values").items():
                cell[key] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                             "n": len(values), "values": values}
    return out


def column(method: str, corrected: bool) -> str:
    """A method's name in the summary: ``ours`` as cut, ``ours+correction`` corrected."""
    return method + ("+correction" if corrected else "")


def _key(pair) -> str:
    return f"{pair[0]:.2f},{pair[1]:.2f}"


GOAL_RIVAL = "label_fisher"  # the strongest rival, and it uses labels
GOAL_STRICT_PAIRS = 2  # the sparsest pairs (about 51% and 41% of the parameters kept): at or above the rival there


def goal(report: dict[str, Any]) -> dict[str, Any]:
    """The goal (issue 28): the default pipeline (``ours``) at or above label Fisher given the same split machinery
    at the two sparsest pairs (about 51% and 41% of the parameters), and within the seed spread (the larger of the two
    standard deviations) at the others, on every metric a model has (own head, linear probe, k-NN), on every
    development model; checked as cut and, separately, with both corrected. Also lists every method that is ahead of
    ``ours`` somewhere, by how much."""
    out: dict[str, Any] = {}
    for corrected in (False, True):
        ours, rival = column(DEFAULT_METHOD, corrected), column(GOAL_RIVAL, corrected)
        checks, behind = [], []
        for model_name, entry in report["models"].items():
            summary = entry["summary"]
            if ours not in summary:
                continue
            pairs = list(summary[ours])
            for index, pair in enumerate(pairs):
                for key, _ in REPORTED:
                    mine = summary[ours][pair].get(key)
                    if not mine or mine["mean"] is None:
                        continue  # (no own head)
                    other = summary.get(rival, {}).get(pair, {}).get(key)
                    if other and other["mean"] is not None:
                        strict = index >= len(pairs) - GOAL_STRICT_PAIRS
                        spread = max(mine["std"], other["std"])
                        margin = mine["mean"] - other["mean"]
                        checks.append({"model": model_name, "pair": pair, "metric": key, "rival": rival,
                                       "margin": margin, "spread": spread, "strict": strict,
                                       "met": margin >= 0 if strict else margin >= -spread})
                    for method, cells in summary.items():
                        cell = cells.get(pair, {}).get(key)
                        if (method.endswith("+correction") == corrected and method != ours and cell
                                and cell["mean"] is not None and cell["mean"] > mine["mean"]):
                            behind.append({"model": model_name, "pair": pair, "metric": key, "rival": method,
                                           "margin": mine["mean"] - cell["mean"]})
        if checks:
            out[ours] = {"rival": rival, "met": all(c["met"] for c in checks), "checks": checks, "behind": behind}
    return out


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    cut = s.get("cut", "split")
    lines = ["# Pruning methods compared at the same split (no retraining)", "",
             f"`python benchmarks/compare_methods.py{' --quick' if report['quick'] else ''} --split {s['split']}"
             f"{' --cut pairs' if cut == 'pairs' else ''}`, "
             f"{report['machine']['date']}, {report['machine']['cpu']} ({report['machine']['torch_threads']} torch "
             f"thread(s)), {report['total_s'] / 60:.0f} min. Raw numbers: `{report['name']}.json`; plots: "
             f"`{report['name']}.png` (parameters), `{report['name']}_flops.png` (FLOPs).",
             "",
             *(["**Unfinished run: the numbers so far.**", ""] if report.get("partial") else []),
             *(merged_from_table(report["merged_from"]) if report.get("merged_from") else []),
             f"Every method through the `prune.py` pipeline with the settings of `configs/prune/demo.yaml`; seeds "
             f"{s['seeds']} (pruning subset, views, probes and search seed); `lamp` and `magnitude` use no data and run "
             "once. " + ("Every method is cut at the parameter count of each (mlp, head) pair, split between heads and "
                         "MLP neurons by the same fitness on its own scores (what `prune.py` does for a parameter "
                         "budget). " if cut == "split" else "Every method is cut at the (mlp, head) pairs as given "
                         "(the fixed schedule: an ablation). ")
             + f"Scored on {'the test split' if s['split'] == 'test' else 'a held-out part of the train split'} "
             f"({s['val_samples'] or 'all'} images); k-NN memory and probe training set: {s['train_samples']} train images. "
             "Top-1 in %, mean ± standard deviation over the seeds; the best mean of each row in bold. "
             "`+correction`: the same models after the SparseGPT-style correction (`--correction.enabled true`, the "
             "same calibration images for every method).", ""]
    for model_name, entry in report["models"].items():
        summary, dense = entry["summary"], entry["dense"]
        lines += [f"## {model_name} ({display(MODELS[model_name])}: {dense['params'] / 1e6:.2f}M params)", ""]
        sizes = entry.get("sizes")
        if sizes and any(sizes.get(k) != s.get(k) for k in SIZE_SETTINGS):
            lines += [f"Measured in its own run: scored on {sizes['val_samples'] or 'all the'} "
                      f"{'test' if sizes['split'] == 'test' else 'held-out'} images, {sizes['train_samples']} train "
                      "images as k-NN memory / probe training set.", ""]
        if entry.get("renamed"):
            lines += ["Renamed since that run: " + ", ".join(f"`{old}` is now `{new}`" for old, new in entry["renamed"].items())
                      + " (the same method; the benchmark's names changed).", ""]
        if entry.get("superseded"):
            lines += ["Measured again in a later run (its default changed), the earlier run's records dropped: "
                      + ", ".join(f"`{m}`" for m in entry["superseded"]) + ".", ""]
        for corrected in (False, True):
            names = [column(m, corrected) for m in s["methods"] if column(m, corrected) in summary]
            if not names:
                continue
            for key, title in REPORTED:
                if dense.get(key) is None:
                    continue  # (no own head)
                lines += [f"### {title}{', corrected' if corrected else ''} (dense {pct(dense[key])})", "",
                          "| (mlp, head) | params | FLOPs | " + " | ".join(n.replace("+correction", "") for n in names)
                          + " |", "|---|---:|---:|" + "---:|" * len(names)]
                for pair in summary[names[0]]:
                    cells = [summary[m].get(pair, {}).get(key) for m in names]
                    best = max((c["mean"] for c in cells if c), default=None)
                    text = [("**{}**" if c and c["mean"] == best else "{}").format(_cell(c, len(s["seeds"]))) for c in cells]
                    first = summary[names[0]][pair]
                    flops = f"{pct(first['flops'] / dense['flops'], 0)}%" if first.get("flops") and dense.get("flops") else "n/a"
                    lines.append(f"| ({pair}) | {pct(first['params'] / dense['params'], 0)}% | {flops} | "
                                 + " | ".join(text) + " |")
                lines.append("")
    lines += degradation_table(report)
    for method, result in report["goal"].items():
        checks, rival = result["checks"], result.get("rival", GOAL_RIVAL)
        lines += [f"## Goal: {method} at or above {rival}{' (both corrected)' if 'correction' in method else ''} at "
                  f"the {GOAL_STRICT_PAIRS} sparsest pairs, within the seed spread at the others (own head, linear "
                  "probe, k-NN)", "",
                  f"**{'Met' if result['met'] else 'Not met'}**: met in {sum(c['met'] for c in checks)} of {len(checks)} "
                  "comparisons. Where it is not:", ""]
        lines += [f"- {c['model']} ({c['pair']}) {c['metric']}: {100 * c['margin']:+.2f} points vs {c['rival']} "
                  f"(seed spread {100 * c['spread']:.2f})" for c in checks if not c["met"]] or ["- nowhere."]
        behind = result.get("behind", [])
        if behind:
            lines += ["", f"Every cell where another method's mean is above {method}'s:", ""]
            lines += [f"- {c['model']} ({c['pair']}) {c['metric']}: {100 * c['margin']:+.2f} points vs {c['rival']}"
                      for c in behind]
        lines.append("")
    return "\n".join(lines)


def degradation(report: dict[str, Any]) -> dict[str, dict[str, dict[str, Optional[float]]]]:
    """``{model: {pair: {metric: points lost}}}``: dense minus the default pipeline's mean, as cut (no correction)."""
    out: dict[str, dict[str, dict[str, Optional[float]]]] = {}
    for model_name, entry in report["models"].items():
        cells = entry["summary"].get(DEFAULT_METHOD, {})
        out[model_name] = {pair: {key: (100 * (entry["dense"][key] - cell[key]["mean"])
                                        if entry["dense"].get(key) is not None and key in cell else None)
                                  for key, _ in REPORTED} for pair, cell in cells.items()}
    return out


def degradation_table(report: dict[str, Any]) -> list[str]:
    """How much each model loses under pruning with the default pipeline (what makes a development model informative:
    one that hardly degrades cannot separate methods)."""
    lost = degradation(report)
    if not any(lost.values()):
        return []
    lines = [f"## What pruning costs each model ({DEFAULT_METHOD}, no correction)", "",
             "Points of top-1 lost against the dense model, mean over the seeds (own head / linear probe / k-NN; "
             "`-`: no own head).", "", "| model | " + " | ".join(
                 f"{pct(c['params'] / e['dense']['params'], 0)}% params" for e in list(report["models"].values())[:1]
                 for c in e["summary"].get(DEFAULT_METHOD, {}).values()) + " |",
             "|---|" + "---:|" * len(next(iter(lost.values())))]
    for model_name, pairs in lost.items():
        cells = ["/".join("-" if v is None else f"{v + 0.0:.1f}".replace("-0.0", "0.0") for v in values.values())
                 for values in pairs.values()]
        lines.append(f"| {model_name} | " + " | ".join(cells) + " |")
    return lines + [""]


def _cell(cell: Optional[dict[str, Any]], seeds: int) -> str:
    if not cell:
        return "n/a"
    return (f"{100 * cell['mean']:.2f}" + (f" ± {100 * cell['std']:.2f}" if cell["n"] > 1 else "")
            + (f" (n={cell['n']})" if cell["n"] != seeds else ""))  # fewer seeds than the others (e.g. weights-only)


def plot(report: dict[str, Any], path: Path) -> None:
    """Accuracy against parameters (``path``) and against FLOPs (``path`` with ``_flops``): every method, as cut
    (solid) and corrected (dashed), one row per model, one column per metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    for axis, target in (("params", path), ("flops", path.with_name(path.stem + "_flops.png"))):
        fig, axes = plt.subplots(len(models), len(REPORTED), figsize=(5 * len(REPORTED), 4 * len(models)), squeeze=False)
        colors: dict[str, Any] = {}
        for row, (model_name, entry) in enumerate(models.items()):
            dense = entry["dense"]
            for ax, (key, title) in zip(axes[row], REPORTED):
                if dense.get(key) is None:
                    ax.set_visible(False)  # (no own head)
                    continue
                for name, cells in entry["summary"].items():
                    if not dense.get(axis) or any(not c.get(axis) or key not in c for c in cells.values()):
                        continue
                    method = name.replace("+correction", "")
                    color = colors.setdefault(method, f"C{len(colors) % 10}")
                    xs = [100 * c[axis] / dense[axis] for c in cells.values()]
                    ys = [100 * c[key]["mean"] for c in cells.values()]
                    errors = [100 * c[key]["std"] for c in cells.values()]
                    ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, color=color,
                                linestyle="--" if name.endswith("+correction") else "-",
                                label=method if not name.endswith("+correction") or method not in entry["summary"] else None,
                                linewidth=2.5 if method == DEFAULT_METHOD else 1.2,
                                zorder=3 if method == DEFAULT_METHOD else 2)
                ax.axhline(100 * dense[key], color="gray", linestyle=":", linewidth=1, label="dense")
                ax.set(title=f"{model_name}: {title}", xlabel=f"{'parameters' if axis == 'params' else 'FLOPs'} kept (%)",
                       ylabel="top-1 (%)")
                ax.grid(alpha=0.3)
        first_shown = next(ax for ax in axes.flat if ax.get_visible())
        first_shown.legend(fontsize=8, title="solid: as cut; dashed: corrected", title_fontsize=7)
        fig.tight_layout()
        target.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(target, dpi=110)
        plt.close(fig)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: the first of --models, one seed, three methods, one pair")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the data subset, crops and search")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                        help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--split", choices=["test", "holdout"], default="test",
                        help="score on the test split (results) or on a held-out part of the train split (choosing defaults)")
    parser.add_argument("--val-samples", type=int, default=0, help="scored images (0: the whole test split / 10000)")
    parser.add_argument("--train-samples", type=int, default=10000, help="k-NN memory / probe train images")
    parser.add_argument("--pairs", default=None,
                        help="(mlp, head) pairs as 'm,h;m,h;...' (default: the paper's six pairs)")
    parser.add_argument("--cut", choices=["split", "pairs"], default="split",
                        help="split: each pair's parameter count, split by the fitness on each method's own scores "
                             "(default); pairs: the pairs as given (the fixed-schedule ablation)")
    parser.add_argument("--correction", choices=["off", "on", "both"], default="both",
                        help="evaluate the models as cut, after the weight correction, or both (default)")
    parser.add_argument("--override", action="append", default=[], help="extra prune.py override, e.g. --search.sigma=0.5")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 on a busy machine)")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/compare_methods[_holdout])")
    parser.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                        help="merge the reports of finished runs over different --models into --out, then exit")
    parser.add_argument("--rename", action="append", default=[], metavar="JSON:OLD=NEW",
                        help="with --merge: a method of one report under its current name (a renamed column); "
                             "JSON:OLD= drops it (measured again by another of the merged runs)")
    parser.add_argument("--mixed-baselines", action="store_true",
                        help="with --merge: merge runs made under different regression baselines, marked in the table")
    args = parse_args(parser, argv)
    if args.merge:
        try:
            renames = dict(item.rsplit("=", 1) for item in args.rename)
            merge(args.merge, Path(args.out) if args.out else RESULTS / "compare_methods", renames,
                  args.mixed_baselines)
        except (OSError, ValueError, KeyError) as err:
            parser.error(f"cannot merge: {err}")
        return
    settings = Settings(models=args.models.split(","), seeds=[int(s) for s in args.seeds.split(",")],
                        methods=args.methods.split(","), split=args.split, train_samples=args.train_samples,
                        val_samples=args.val_samples or None, cut=args.cut, correction=args.correction,
                        pairs=[tuple(float(v) for v in p.split(",")) for p in args.pairs.split(";")] if args.pairs
                        else list(PAPER_PAIRS),
                        overrides=args.override)
    for name, known in (("models", MODELS), ("methods", METHODS)):
        unknown = set(getattr(settings, name)) - set(known)
        if unknown:
            parser.error(f"unknown {name} {sorted(unknown)}; choose from {','.join(known)}")
    if args.quick:
        settings = settings.quick()
    suffix = "_quick" if args.quick else ("" if args.split == "test" else f"_{args.split}") + (
        "_pairs" if args.cut == "pairs" else "")
    prefix = Path(args.out) if args.out else RESULTS / f"compare_methods{suffix}"
    run(settings, prefix, args.threads, args.quick)


if __name__ == "__main__":
    main()
