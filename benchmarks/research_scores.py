"""Issue 23 research harness: local scores x search x fitness-chosen split, on the holdout split, over seeds.

The results in ``benchmarks/results/research/holdout.jsonl`` (and the log ``LOG.md`` beside it) were measured
with the pre-port version of this script, at commit 95e5592 of branch quality-research (``research/`` there;
the last lines were appended from that commit's working tree, whose one uncommitted change, the scorers'
``target="predictions"``, none of them uses); porting it to the current API did not change their numbers, and
a variant means what it meant then (the search defaults changed since: the variants name the old values).

    OMP_NUM_THREADS=1 python benchmarks/research_scores.py --threads 1 --models reference,dev_p7 --seeds 0,1,2 \
        --variants ours,label_fisher_split,...              # appends to benchmarks/results/research/holdout.jsonl
    python benchmarks/research_scores.py --summary          # mean ± std tables over seeds from that file
    python benchmarks/research_scores.py --goal sens_none_split:ours,label_fisher_split   # where a variant loses
    OMP_NUM_THREADS=1 python benchmarks/research_scores.py --quick --out /tmp/research_quick.jsonl   # smoke run

Every variant is cut, as ``prune.py`` cuts a sparsity budget, at the parameter counts of the four sparsest
paper pairs (~71/61/51/41% of the parameters kept) with the head/MLP split chosen by ``choose_splits`` on the
variant's own scores (the budgets' own splits, no grid), and evaluated (own head, linear probe, k-NN) on a
held-out part of the train split (``compare_methods.py --split holdout``'s images), with the settings of
``configs/prune/demo.yaml`` for the rest (data, keep ratios, fitness images, PCA). Variants (``VARIANTS``):

- a local score (a ``build_scorer`` name, with ``target="predictions"`` from :mod:`benchmarks.research_custom`,
  or a custom function there: head ablation, iterative sensitivity, PCA sensitivity, Gram greedy);
- coefficients: searched (``ours``, ``*_search*``: the pre-port demo search, SNES with 80 evaluations from
  1.2 .. 0.8, or from 1 where the name ends in ``1``), the search's old initial coefficients 1.2 .. 0.8
  (``*_split``, as compare_methods' baselines were then), or none (``*_none_split``, the local scores alone);
  ``*_splitsearch``: a search at the splits the export chooses (``research_custom.split_search``);
- ``+sgpt`` / ``+bias``: the same sub-networks with the SparseGPT-style correction / FLAP's bias compensation.

``ours`` is SnapViT's SSL-Fisher with that search (what ``prune.py`` did then; today's ``ours`` in
``compare_methods.py`` is the sensitivity score without search). Local scores and searched coefficients are
cached under ``benchmarks/results/research/cache`` (git-ignored; by model, seed and configuration), results are
appended to a JSON-lines file, one line per (model, seed, variant); a (model, seed, variant) already in the
file is skipped, so runs can be resumed and extended. A record's ``config`` is its variant's fields: records
measured before the port show ``"search": {}`` (the demo's search then) where new ones name its values.
``--quick`` shrinks everything (the first model, seed 0, two cheap variants, 64 pruning images, 300 / 200
evaluation images, 4 search evaluations; a separate cache key) into ``cache/quick.jsonl`` unless ``--out``.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    MODELS, RESULTS, Progress, display, model_overrides, parse_args, provenance, prune_setup, write_markdown,
)
from benchmarks.compare_methods import CachedEvaluation, Settings, evaluation_data, with_probe_head  # noqa: E402
from benchmarks.research_custom import (  # noqa: E402
    CUSTOM as _RESEARCH, OLD_DEMO_SEARCH, POST as _POST, research_scorer,
)
from snapvit_pl.elastic import PAPER_PAIRS, Budget, CostModel, ElasticScores, initial_coefficients  # noqa: E402
from snapvit_pl.models import fingerprint  # noqa: E402
from snapvit_pl.pipeline import (  # noqa: E402
    Correction, CorrectionSettings, EvaluationSettings, choose_splits, extract_models, local_importance, run_search,
    scoring_views, split_table,
)
from snapvit_pl.scoring import LocalScores  # noqa: E402
from snapvit_pl.scoring.base import ScoringContext  # noqa: E402
from snapvit_pl.search import SearchSettings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESEARCH = RESULTS / "research"
CACHE = RESEARCH / "cache"  # git-ignored (RESEARCH/.gitignore)
PAIRS = list(PAPER_PAIRS[-4:])  # ~71/61/51/41% of the parameters kept
#: ``--deep`` (issue 46): ~51/41/31/21% of the parameters kept, the two paper pairs and two deeper ones
DEEP_PAIRS = [tuple(PAPER_PAIRS[-2]), tuple(PAPER_PAIRS[-1]), (0.75, 0.6), (0.85, 0.65)]  # (0.65: 3 heads keep 1)
#: the pairs the selection and paired tables show (``--deep``: all of them)
SHOWN = PAIRS[-3:]
REPORTED = ("head_top1", "linear_top1", "knn_top1")
TITLES = {"head_top1": "own head", "linear_top1": "linear probe", "knn_top1": "k-NN"}  # of REPORTED
def _search_fields(settings: SearchSettings) -> dict[str, Any]:
    """The coefficient-search fields of a preset (not its fitness sizes, which the config gives)."""
    return {k: getattr(settings, k) for k in ("optimizer", "max_evaluations", "popsize", "sigma", "parametrization",
                                               "initial_range")}


PAPER_SEARCH, SNES_SEARCH = _search_fields(SearchSettings.paper()), _search_fields(SearchSettings.snes())
#: the search's initial coefficients before the port (today's default is 1 .. 1): what ``coefficients="initial"``
#: gives a variant without search
OLD_INITIAL_RANGE = (1.2, 0.8)
#: ``--quick``: what ``compare_methods.Settings.quick()`` shrinks, as prune.py overrides and sizes
QUICK_OVERRIDES = ["--data.init_args.max_samples=64", "--search.num_images=64", "--search.pca_components=16",
                   "--correction.num_samples=32"]
QUICK_VARIANTS = ["sens_none_split", "label_fisher_split"]
QUICK_SIZES = {"train_samples": 300, "val_samples": 200, "search_evaluations": 4}


@dataclass
class Variant:
    """One method: a local score, optional coefficient search, the fitness-chosen split, optional correction.

    Attributes:
        scorer: a ``build_scorer`` name (``research_custom.research_scorer``: with ``target="predictions"`` for
            ``sensitivity`` and ``gn_greedy``), or a key of ``CUSTOM`` (a function of the setup returning LocalScores).
        kwargs: scorer constructor arguments.
        search: None (no search), or overrides of the config's search settings; the searched variants name
            ``max_evaluations`` and ``initial_range`` (``OLD_DEMO_SEARCH``: the pre-port demo's, which ``{}`` meant
            before the port), since the defaults changed (no search, coefficients 1).
        coefficients: with no search: ``initial`` (the pre-port search's initial mean 1.2 .. 0.8,
            ``OLD_INITIAL_RANGE``, as compare_methods' baselines had then) or ``none`` (the local scores alone).
        views: the pruning-data views the scorer gets (None: as the pipeline chooses).
        correction: ``None``, ``"sparsegpt"`` or ``"bias"`` (FLAP bias compensation).
        post: a key of ``POST``: a function (setup, scores, images, cost, log) -> scores applied before the split.
        post_kwargs: its keyword arguments.
        fitness: overrides of the fitness sizes (``num_images``, ``pca_components``) for the search and the split
            choice (None: the config's).
    """

    scorer: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    search: Optional[dict[str, Any]] = None
    coefficients: str = "initial"
    views: Optional[str] = None
    correction: Optional[str] = None
    post: Optional[str] = None
    post_kwargs: dict[str, Any] = field(default_factory=dict)
    fitness: Optional[dict[str, int]] = None


VARIANTS: dict[str, Variant] = {
    "ours": Variant("ssl_fisher", search=dict(OLD_DEMO_SEARCH)),  # SnapViT as prune.py ran it before issue 23
    "ssl_fisher_split": Variant("ssl_fisher"),
    "label_fisher_split": Variant("label_fisher"),
    "snip_magnitude_split": Variant("snip_magnitude"),
    "activation_split": Variant("activation", views="plain"),
    "activation_mean_split": Variant("activation", {"tokens": "mean"}, views="plain"),
    "wanda_sp_split": Variant("wanda_sp", views="plain"),
    "flap_split": Variant("flap", views="plain"),
    "taylor_split": Variant("taylor"),
    "activation_z_split": Variant("activation", {"standardize": "zscore"}, views="plain"),
    "wanda_sp_z_split": Variant("wanda_sp", {"standardize": "zscore"}, views="plain"),
    # research: Gauss-Newton output sensitivity and per-sample mask Fisher
    "sens_none_split": Variant("sensitivity", {"probes": 8}, views="plain", coefficients="none"),  # the default until issue 30
    "sens_split": Variant("sensitivity", views="plain"),
    "sens_search": Variant("sensitivity", views="plain", search=dict(OLD_DEMO_SEARCH)),
    "sens_search1": Variant("sensitivity", views="plain", search={**OLD_DEMO_SEARCH, "initial_range": (1.0, 1.0)}),
    "smf_none_split": Variant("ssl_mask_fisher", coefficients="none"),
    "smf_search1": Variant("ssl_mask_fisher", search={**OLD_DEMO_SEARCH, "initial_range": (1.0, 1.0)}),
    "abl_sens_none_split": Variant("head_ablation", coefficients="none"),
    "iter_sens_split": Variant("iter_sens", coefficients="none"),
    "ours_splitsearch": Variant("ssl_fisher", post="split_search", post_kwargs=dict(OLD_DEMO_SEARCH)),
    "sens_pca_none_split": Variant("sens_pca", coefficients="none"),
    "sens_center_none_split": Variant("sens_pca", {"project": False}, coefficients="none"),
    "sens16_none_split": Variant("sensitivity", {"probes": 16}, views="plain", coefficients="none"),
    # issue 30: fewer probes per image (each probe is one backward pass of the importance stage)
    "sens4_none_split": Variant("sensitivity", {"probes": 4}, views="plain", coefficients="none"),
    "sens2_none_split": Variant("sensitivity", {"probes": 2}, views="plain", coefficients="none"),
    "gram_none_split": Variant("gram_greedy", coefficients="none"),
    "gn_greedy_split": Variant("gn_greedy", {"probes": 8, "gram": "full", "cross_weight": 1.0}, views="plain", coefficients="none"),
    "gn_greedy_block_split": Variant("gn_greedy", {"probes": 8, "gram": "block", "cross_weight": 1.0}, views="plain", coefficients="none"),
    "sens_pred_none_split": Variant("sensitivity", {"target": "predictions"}, views="plain", coefficients="none"),
    "gn_pred_split": Variant("gn_greedy", {"target": "predictions"}, views="plain", coefficients="none"),
    "gram_bd_none_split": Variant("gram_greedy", {"block_diagonal": True}, coefficients="none"),
    "sens_splitsearch": Variant("sensitivity", views="plain", coefficients="none", post="split_search",
                                post_kwargs={**OLD_DEMO_SEARCH, "initial_range": (1.0, 1.0)}),
    # issue 28 / 31: today's searches (SearchSettings.paper(): the preset's xNES; SearchSettings.snes()), with
    # SSL-Fisher and with the default score (from coefficients 1), and the fitness sizes of the library defaults
    "ssl_fisher_xnes": Variant("ssl_fisher", search=PAPER_SEARCH),
    "ssl_fisher_snes": Variant("ssl_fisher", search=SNES_SEARCH),
    "sens_xnes1": Variant("sensitivity", views="plain", search={**PAPER_SEARCH, "initial_range": (1.0, 1.0)}),
    "sens_snes1": Variant("sensitivity", views="plain", search={**SNES_SEARCH, "initial_range": (1.0, 1.0)}),
    "label_fisher_none_split": Variant("label_fisher", coefficients="none"),
    # issue 38: the Gauss-Newton greedy with today's probe count, exact (full Gram) and its scalable forms: the
    # block-diagonal Gram, the Nystrom low-rank cross-block terms at several ranks, and the greedy in chunks of the
    # size ViT-B/16's 35,000 removable units take with 4096 steps (about 9 units per step: 256 steps here)
    "gn4_full": Variant("gn_greedy", {"probes": 4, "gram": "full", "cross_weight": 1.0}, views="plain", coefficients="none"),
    "gn4_block": Variant("gn_greedy", {"probes": 4, "gram": "block", "cross_weight": 1.0}, views="plain", coefficients="none"),
    **{f"gn4_lowrank{r}": Variant("gn_greedy", {"probes": 4, "gram": "lowrank", "rank": r, "cross_weight": 1.0}, views="plain",
                                  coefficients="none") for r in (32, 128, 512)},
    "gn4_steps256": Variant("gn_greedy", {"probes": 4, "gram": "full", "max_steps": 256, "cross_weight": 1.0}, views="plain",
                            coefficients="none"),
    # exact Jacobians (one backward pass per embedding dimension: no probe noise), and 16 probes
    "gn0_full": Variant("gn_greedy", {"probes": 0, "gram": "full", "cross_weight": 1.0}, views="plain", coefficients="none"),
    "gn16_full": Variant("gn_greedy", {"probes": 16, "gram": "full", "cross_weight": 1.0}, views="plain", coefficients="none"),
    # the interaction terms' weight: 0 (each unit's own drift per parameter, no interactions), 0.5 (shrunk)
    **{f"gn4_cw{str(w).replace('.', '')}": Variant("gn_greedy", {"probes": 4, "gram": "full", "cross_weight": w},
                                                  views="plain", coefficients="none") for w in (0.0, 0.5)},
    "sens_none_split_f1000": Variant("sensitivity", views="plain", coefficients="none",
                                     fitness={"num_images": 1000, "pca_components": 192}),
    # issue 46: re-linearised in stages (one importance pass each), with the interaction weight re-decided, and the
    # order that anticipates the correction (alone and with stages)
    **{f"gn4_st{k}": Variant("gn_greedy", {"probes": 4, "gram": "full", "cross_weight": 0.5, "stages": k},
                             views="plain", coefficients="none") for k in (2, 3, 4)},
    **{f"gn4_st{k}_cw1": Variant("gn_greedy", {"probes": 4, "gram": "full", "cross_weight": 1.0, "stages": k},
                                 views="plain", coefficients="none") for k in (3,)},
    "gn4_ca": Variant("gn_greedy", {"probes": 4, "gram": "full", "cross_weight": 0.5, "correction_aware": True},
                      views="plain", coefficients="none"),
    "gn4_st3_nolin": Variant("gn_greedy_nolin", {"probes": 4, "gram": "full", "cross_weight": 0.5, "stages": 3},
                             views="plain", coefficients="none"),
    **{f"gn4_late{int(100 * a)}_st{k}": Variant("gn_greedy_late", {"probes": 4, "gram": "full", "cross_weight": 0.5,
                                                                   "stages": k, "start": a}, views="plain",
                                                 coefficients="none") for a, k in ((0.7, 2), (0.6, 3))},
    # issue 45: the pass in bf16 autocast (the default on CUDA) against fp32, on the same images and probes
    "gn4_bf16": Variant("gn_greedy", {"probes": 4, "gram": "full", "cross_weight": 0.5, "precision": "bf16"},
                        views="plain", coefficients="none"),
    "gn4_st3_ca": Variant("gn_greedy", {"probes": 4, "gram": "full", "cross_weight": 0.5, "stages": 3,
                                        "correction_aware": True}, views="plain", coefficients="none"),
}
# the same sub-networks with SparseGPT correction (and FLAP's bias compensation) at extraction
for _name in ("ours", "label_fisher_split", "snip_magnitude_split", "taylor_split", "flap_split", "sens_none_split",
              "sens4_none_split", "gn4_full", "gn4_cw05", "gn_greedy_split", "gn4_st2", "gn4_st3", "gn4_st4",
              "gn4_st3_cw1", "gn4_ca", "gn4_st3_ca", "gn4_late70_st2", "gn4_late60_st3", "activation_z_split", "wanda_sp_z_split", "label_fisher_none_split", "ssl_fisher_xnes"):
    if _name in VARIANTS:
        VARIANTS[f"{_name}+sgpt"] = replace(VARIANTS[_name], correction="sparsegpt")
        VARIANTS[f"{_name}+bias"] = replace(VARIANTS[_name], correction="bias")
CUSTOM: dict[str, Callable[..., LocalScores]] = dict(_RESEARCH)
POST: dict[str, Callable[..., ElasticScores]] = dict(_POST)


def key_of(*parts: Any) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def cached(path: Path, compute: Callable[[], Any]) -> tuple[Any, float, bool]:
    """(value, seconds it took when computed, hit) with the value stored under ``path``."""
    if path.exists():
        stored = torch.load(path, weights_only=False)
        return stored["value"], stored["seconds"], True
    started = time.perf_counter()
    value = compute()
    seconds = time.perf_counter() - started
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"value": value, "seconds": seconds}, path)
    return value, seconds, False


def local_scores(variant: Variant, setup, model_name: str, seed: int, cache: Path = CACHE,
                 tag: Sequence[str] = ()) -> tuple[LocalScores, float, bool]:
    """``tag``: what else sets the scores (the ``--quick`` overrides): part of the cache key when not empty."""
    key = key_of(variant.scorer, variant.kwargs, variant.views, *_tag(tag))
    path = cache / f"{model_name}_s{seed}_{variant.scorer}_{key}.pt"

    def compute() -> LocalScores:
        if variant.scorer in CUSTOM:
            return CUSTOM[variant.scorer](setup, seed=seed, **variant.kwargs)
        scorer = research_scorer(variant.scorer, **variant.kwargs)
        if variant.scorer == "random":
            scorer = research_scorer("random", seed=seed)
        context = ScoringContext(min_mlp_keep=setup.importance.min_mlp_keep,  # as the run hands them over
                                 min_head_keep=setup.importance.min_head_keep)
        dm = setup.datamodule
        dm.train_views = variant.views or scoring_views(scorer)
        model = setup.model
        if scorer.requires_labels and not getattr(model, "num_classes", 0):
            model = with_probe_head(setup)  # a backbone without classifier (compare_methods does the same)
        return local_importance(scorer, model, dm.train_dataloader() if scorer.requires_data else [], context)

    return cached(path, compute)


def _tag(tag: Sequence[str]) -> list[list[str]]:
    return [list(tag)] if tag else []  # no tag: the keys of the pre-port cache


def search_coefficients(variant: Variant, setup, local: ElasticScores, images, model_name: str, seed: int, log,
                        cache: Path = CACHE, tag: Sequence[str] = (), evaluations: Optional[int] = None):
    """``evaluations``: replaces the variant's ``max_evaluations`` (``--quick``)."""
    settings = replace(setup.search, **(variant.fitness or {}), **variant.search)
    if evaluations is not None:
        settings = replace(settings, max_evaluations=evaluations)
    path = cache / (f"{model_name}_s{seed}_search_{variant.scorer}_"
                    f"{key_of(variant.scorer, variant.kwargs, variant.views, settings.to_dict(), *_tag(tag))}.pt")

    def compute():
        result = run_search(setup.model, images, local, settings)
        log(f"    search {result.evaluations} evaluations: fitness {result.initial_fitness:.4f} -> {result.best_fitness:.4f}")
        return {"coefficients": result.coefficients, "summary": result.summary()}

    return cached(path, compute)


def run(models: list[str], seeds: list[int], variants: list[str], out: Path, val_samples: int, train_samples: int,
        log: Progress, cache: Path = CACHE, overrides: Sequence[str] = (), search_evaluations: Optional[int] = None) -> None:
    """Append one record per (model, seed, variant) not yet in ``out``.

    ``overrides``: extra prune.py overrides (``--quick``'s sizes; part of the cache keys); ``search_evaluations``:
    the evaluations of every search (None: each variant's own)."""
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["model"], r["seed"], r["variant"]))
    for model_name in models:
        evaluation = None
        for seed in seeds:
            todo = [v for v in variants if (model_name, seed, v) not in done]
            if not todo:
                continue
            setup = prune_setup(*model_overrides(model_name), f"--data.init_args.seed={seed}", f"--search.seed={seed}",
                                *overrides)
            if evaluation is None:  # the same evaluation images whatever the seeds (those of data seed 0)
                settings = Settings(split="holdout", val_samples=val_samples, train_samples=train_samples)
                eval_setup = setup if seed == 0 else prune_setup(*model_overrides(model_name), "--data.init_args.seed=0",
                                                                 *overrides)
                has_head = bool(getattr(setup.model, "num_classes", 0))  # (the self-supervised model has none)
                evaluation = CachedEvaluation(EvaluationSettings(metrics=["knn", "linear", *(["head"] if has_head else [])],
                                                                 train_samples=train_samples, val_samples=val_samples),
                                              evaluation_data(eval_setup, settings), device=torch.device("cpu"))
            config_images = setup.datamodule.unlabeled_images(setup.search.num_images, setup.search.batch_size)
            cost = CostModel(setup.model)
            blocks = len(setup.model.blocks)
            for name in todo:
                variant = VARIANTS[name]
                record: dict[str, Any] = {"model": model_name, "seed": seed, "variant": name,
                                          "config": {k: v for k, v in variant.__dict__.items()}}
                fitness = replace(setup.search, **(variant.fitness or {}))
                images = config_images if not variant.fitness else setup.datamodule.unlabeled_images(
                    fitness.num_images, fitness.batch_size)
                local, record["scoring_s"], hit = local_scores(variant, setup, model_name, seed, cache, overrides)
                log(f"{model_name} seed {seed} {name}: scores {'cached' if hit else 'computed'} ({record['scoring_s']:.1f}s)")
                scores = ElasticScores(local.heads, local.neurons, None, setup.spec.to_dict(), fingerprint(setup.model),
                                       setup.importance.min_mlp_keep, setup.importance.min_head_keep)
                if variant.search is not None:
                    found, record["search_s"], _ = search_coefficients(variant, setup, scores, images, model_name, seed,
                                                                       log, cache, overrides, search_evaluations)
                    scores.coefficients = found["coefficients"]
                    record["search"] = found["summary"]
                elif variant.coefficients == "initial":
                    scores.coefficients = initial_coefficients(blocks, [len(h) for h in local.heads], *OLD_INITIAL_RANGE)
                if variant.post is not None:
                    started = time.perf_counter()
                    kwargs = dict(variant.post_kwargs)
                    if search_evaluations is not None:
                        kwargs["max_evaluations"] = search_evaluations
                    scores = POST[variant.post](setup, scores, images, cost, log, **kwargs)
                    record["post_s"] = time.perf_counter() - started
                budgets = [Budget(params=cost.params(scores.subnet(Budget(mlp_ratio=m, head_ratio=h), cost)[0]))
                           for m, h in PAIRS]
                started = time.perf_counter()
                choices = choose_splits(setup.model, images, scores, budgets, fitness,
                                        replace(setup.export, split_grid=0), cost)  # these budgets only, no grid
                scores.splits = split_table(choices)
                record["split_s"] = time.perf_counter() - started
                record["drift"] = [min(c[2] for c in choice.candidates) for choice in choices]
                correction = None
                if variant.correction == "sparsegpt":
                    correction = Correction(CorrectionSettings(enabled=True), images)
                elif variant.correction == "bias":
                    correction = BiasCorrection(images)
                started = time.perf_counter()
                items = extract_models(setup.model, scores, budgets, evaluation=evaluation, cost=cost, correction=correction)
                record["evaluation_s"] = time.perf_counter() - started
                record["rows"] = [{"pair": list(pair), "ratios": [it.mlp_ratio, it.head_ratio], "params": it.params,
                                   "heads": it.subnet.head_counts, "mlp_hidden": it.subnet.neuron_counts,
                                   **{k: it.metrics.get(k) for k in REPORTED}} for pair, it in zip(PAIRS, items)]
                log(f"  {name}: " + "; ".join(f"{tuple(r['pair'])} h{r['ratios'][1]:.2f} "
                                             + "/".join("-" if r[k] is None else f"{100 * r[k]:.2f}" for k in REPORTED)
                                             for r in record["rows"]))
                record["provenance"] = provenance({"model": model_name, "seed": seed, "variant": name,
                                                   "val_samples": val_samples, "train_samples": train_samples,
                                                   "overrides": list(overrides)})
                with out.open("a") as f:
                    f.write(json.dumps(record) + "\n")


class BiasCorrection:
    """FLAP bias compensation as an extraction correction step."""

    def __init__(self, images: torch.Tensor, num_samples: int = 256):
        self.images = images[:num_samples]

    def __call__(self, base, subnet):
        from snapvit_pl.correction import compensate_bias_and_prune

        return compensate_bias_and_prune(copy.deepcopy(base), subnet, self.images), {"bias": True}


def summary(path: Path, variants: Optional[list[str]] = None, models: Optional[list[str]] = None) -> str:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault((r["model"], r["variant"]), []).append(r)
    names = variants or list(dict.fromkeys(r["variant"] for r in records))
    lines = []
    for model_name in models or list(dict.fromkeys(r["model"] for r in records)):
        for key in REPORTED:
            lines += ["", f"### {model_name}: {key} (holdout, mean ± std over seeds [n])", "",
                      "| variant | " + " | ".join(f"{tuple(p)}" for p in PAIRS) + " | mean | time (s) |",
                      "|---|" + "---:|" * (len(PAIRS) + 2)]
            for name in names:
                runs = by.get((model_name, name))
                if not runs or runs[0]["rows"][0].get(key) is None:
                    continue  # (not measured, or no own head)
                cells, means = [], []
                for i in range(len(PAIRS)):
                    values = [100 * r["rows"][i][key] for r in runs]
                    m = statistics.fmean(values)
                    means.append(m)
                    sd = statistics.stdev(values) if len(values) > 1 else 0.0
                    cells.append(f"{m:.2f} ± {sd:.2f}")
                seconds = statistics.fmean(r.get("scoring_s", 0) + r.get("search_s", 0) + r.get("post_s", 0) for r in runs)
                lines.append(f"| {name} [{len(runs)}] | " + " | ".join(cells) + f" | {statistics.fmean(means):.2f} | {seconds:.0f} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="reference,dev_p7")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=None,
                        help="JSON-lines results (default benchmarks/results/research/holdout.jsonl; --quick: "
                             "benchmarks/results/research/cache/quick.jsonl)")
    parser.add_argument("--cache", default=str(CACHE), help="cache of local scores and searched coefficients")
    parser.add_argument("--val-samples", type=int, default=5000, help="holdout images scored")
    parser.add_argument("--train-samples", type=int, default=5000, help="k-NN memory / probe train images")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: the first of --models, seed 0, two cheap variants (unless --variants), "
                             "64 pruning images, 300 / 200 evaluation images, 4 search evaluations")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--orders", default=None, metavar="A:B:MARKDOWN",
                        help="write how far the cached local scores of variants A and B order the units alike (per "
                             "model and seed of --models / --seeds: Spearman's rho of the orders, the share of units "
                             "both keep at 51 / 41%% of the units) to MARKDOWN, then exit")
    parser.add_argument("--deep", action="store_true", help="cut at ~51/41/31/21%% of the parameters (issue 46) "
                        "instead of ~71/61/51/41%%")
    parser.add_argument("--summary", action="store_true", help="print the tables of --out and exit")
    parser.add_argument("--goal", default=None, help="VARIANT:RIVAL,RIVAL,...: where VARIANT's mean loses, then exit")
    parser.add_argument("--selection", default=None, metavar="MARKDOWN",
                        help="write the selection table of --variants over --models (from --out) to this file, then exit")
    parser.add_argument("--paired", default=None, metavar="BASELINE:MARKDOWN",
                        help="write each of --variants minus BASELINE, paired by seed, over --models to MARKDOWN, "
                             "then exit")
    args = parse_args(parser, argv)
    if args.deep:
        global PAIRS, SHOWN
        PAIRS, SHOWN = list(DEEP_PAIRS), list(DEEP_PAIRS)
    out = Path(args.out) if args.out else (CACHE / "quick.jsonl" if args.quick else RESEARCH / "holdout.jsonl")
    variants = args.variants.split(",")
    if args.goal:
        ours, rivals = args.goal.split(":")
        print(goal_check(out, ours, rivals.split(",")))
        return
    if args.summary:
        print(summary(out, variants if args.variants != ",".join(VARIANTS) else None, args.models.split(",")))
        return
    if args.paired:
        baseline, target = args.paired.split(":", 1)
        text = paired_table(out, variants, baseline, args.models.split(","))
        write_markdown(Path(target), text, args)
        print(text)
        return
    if args.orders:
        first, second, target = args.orders.split(":", 2)
        text = orders_table(first, second, args.models.split(","), [int(x) for x in args.seeds.split(",")],
                            Path(args.cache))
        write_markdown(Path(target), text, args)
        print(text)
        return
    if args.selection:
        text = selection_table(out, variants, args.models.split(","))
        write_markdown(Path(args.selection), text, args)
        print(text)
        return
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {','.join(VARIANTS)}")
    models, seeds = args.models.split(","), [int(s) for s in args.seeds.split(",")]
    unknown = set(models) - set(MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {','.join(MODELS)}")
    sizes: dict[str, Any] = {"val_samples": args.val_samples, "train_samples": args.train_samples}
    overrides: list[str] = []
    if args.quick:
        models, seeds, overrides = models[:1], [0], list(QUICK_OVERRIDES)
        variants = QUICK_VARIANTS if args.variants == ",".join(VARIANTS) else variants
        sizes = dict(QUICK_SIZES)
    torch.set_num_threads(args.threads)
    out.parent.mkdir(parents=True, exist_ok=True)
    run(models, seeds, variants, out, sizes["val_samples"], sizes["train_samples"], Progress(), Path(args.cache),
        overrides, sizes.get("search_evaluations"))



def selection_table(path: Path, variants: list[str], models: list[str]) -> str:
    """The tables the defaults are chosen from, one per metric (own head on the models that have one, linear probe,
    k-NN): per variant and model, the mean over seeds at 61 / 51 / 41% of the parameters, and the number of seeds."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault((r["model"], r["variant"]), []).append(r)
    shown = SHOWN
    lines = [f"Mean over seeds on held-out train images (`{display(path)}`), top-1 in % at "
             + " / ".join(f"{tuple(p)}" for p in shown) + f" (about {' / '.join(_kept(p) for p in shown)}% of the parameters kept), every variant "
             "cut at the same parameter counts with its own fitness-chosen split; [n] seeds; `-`: not run.", ""]
    for key in REPORTED:
        having = [m for m in models if any(r["model"] == m and r["rows"][0].get(key) is not None for r in records)]
        if not having:
            continue
        lines += [f"**{TITLES[key]}**", "", "| variant | " + " | ".join(having) + " |", "|---|" + "---|" * len(having)]
        for name in variants:
            cells = []
            for m in having:
                runs = by.get((m, name), [])
                if not runs:
                    cells.append("-")
                    continue
                means = [statistics.fmean(100 * r["rows"][PAIRS.index(p)][key] for r in runs) for p in shown]
                cells.append(" / ".join(f"{v:.2f}" for v in means) + f" [{len(runs)}]")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["**What each costs**: importance passes over the pruning images (one per stage of a re-linearised greedy) "
              "and the local scores' seconds on one CPU thread (the passes and the greedy's orders; mean over every "
              "model and seed run, on a shared 2-core machine), against the first variant's.", "",
              "| variant | passes | seconds | x first |", "|---|---:|---:|---:|"]
    base = None
    for name in variants:
        runs = [r for r in records if r["variant"] == name and r["model"] in models]
        if not runs:
            continue
        passes = VARIANTS[name].kwargs.get("stages", 1) if name in VARIANTS else 1
        timed = [r["scoring_s"] for r in runs if r.get("scoring_s")]  # records older than the timing have none
        if not timed:
            lines.append(f"| {name} | {passes} | not recorded | - |")
            continue
        seconds = statistics.fmean(timed)
        base = base or seconds
        lines.append(f"| {name} | {passes} | {seconds:.1f} | {seconds / base:.2f} |")
    return "\n".join(lines)


def orders_table(first: str, second: str, models: list[str], seeds: list[int], cache: Path = CACHE) -> str:
    """How alike variants ``first`` and ``second`` order the units (their cached local scores, the same pruning images
    and probes): Spearman's rho over all units (heads and neurons of every block in one order: the scores are the
    greedy's removal positions) and the share of the units both keep when the 49% / 59% lowest are cut."""
    lines = [f"`{first}` against `{second}`: the same pruning images and probes, their local scores read from the "
             "research cache. *rho*: Spearman's rank correlation of the two removal orders over every unit; *kept "
             "alike at N%*: of the units each keeps when the lowest-scored units are cut down to N% of them, the share "
             "both keep.", "", "| model | seed | units | rho | kept alike at 51% | kept alike at 41% |",
             "|---|---:|---:|---:|---:|---:|"]
    for model_name in models:
        for seed in seeds:
            found = []
            for name in (first, second):
                v = VARIANTS[name]
                path = cache / f"{model_name}_s{seed}_{v.scorer}_{key_of(v.scorer, v.kwargs, v.views)}.pt"
                if not path.exists():
                    break
                local = torch.load(path, weights_only=False)["value"]
                found.append(torch.cat([t for pair in zip(local.heads, local.neurons) for t in pair]).double())
            if len(found) < 2:
                continue
            ranks = [torch.argsort(torch.argsort(f)).double() for f in found]
            n = len(ranks[0])
            rho = 1 - 6 * float(((ranks[0] - ranks[1]) ** 2).sum()) / (n * (n * n - 1))
            alike = []
            for keep in (0.51, 0.41):
                cut = n - round(keep * n)
                kept = [set(torch.argsort(f)[cut:].tolist()) for f in found]
                alike.append(len(kept[0] & kept[1]) / len(kept[0]))
            lines.append(f"| {model_name} | {seed} | {n:,} | {rho:.4f} | {alike[0]:.1%} | {alike[1]:.1%} |")
    return "\n".join(lines)


def _kept(pair: Sequence[float]) -> str:
    """About how many % of the parameters a (mlp, head) pair keeps (2/3 of a block's weights are its MLP's)."""
    return f"{round(100 * (1 - (2 * pair[0] + pair[1]) / 3)):d}"


def paired_table(path: Path, variants: list[str], baseline: str, models: list[str]) -> str:
    """Each variant minus ``baseline`` on the same seeds (the same pruning and evaluation images): per model and
    metric, the mean ± standard deviation of the per-seed differences at 61 / 51 / 41% of the parameters."""
    records = {(r["model"], r["seed"], r["variant"]): r
               for r in (json.loads(line) for line in path.read_text().splitlines())}
    shown = SHOWN
    lines = [f"Top-1 of each variant minus `{baseline}`'s, in points, on the same seeds (`{display(path)}`): mean ± "
             "standard deviation over the seeds at " + " / ".join(f"{tuple(p)}" for p in shown)
             + f" (about {' / '.join(_kept(p) for p in shown)}% of the parameters kept); [n] seeds.", ""]
    for name in variants:
        lines += [f"**{name}**", "", "| model | " + " | ".join(TITLES[k] for k in REPORTED) + " |", "|---|---|---|---|"]
        for m in models:
            seeds = sorted(s for (model, s, v) in records if model == m and v == name
                           and (m, s, baseline) in records)
            cells = []
            for key in REPORTED:
                per_pair = []
                for p in shown:
                    i = PAIRS.index(p)
                    diffs = [100 * (records[(m, s, name)]["rows"][i][key] - records[(m, s, baseline)]["rows"][i][key])
                             for s in seeds if records[(m, s, name)]["rows"][i][key] is not None]
                    if diffs:
                        spread = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
                        per_pair.append(f"{statistics.fmean(diffs):+.2f} ± {spread:.2f}")
                cells.append(" / ".join(per_pair) + f" [{len(seeds)}]" if per_pair else "-")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def goal_check(path: Path, ours: str, rivals: list[str]) -> str:
    """Where ``ours`` (mean over seeds) is below each rival's mean, per model, pair and metric (own head, linear)."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault((r["model"], r["variant"]), []).append(r)
    lines, total, lost = [], 0, 0
    for model_name in dict.fromkeys(r["model"] for r in records):
        if (model_name, ours) not in by:
            continue
        for i, pair in enumerate(PAIRS):
            for key in REPORTED[:2]:
                mine = statistics.fmean(100 * r["rows"][i][key] for r in by[(model_name, ours)])
                for rival in rivals:
                    if (model_name, rival) not in by:
                        continue
                    theirs = statistics.fmean(100 * r["rows"][i][key] for r in by[(model_name, rival)])
                    total += 1
                    if mine < theirs:
                        lost += 1
                        lines.append(f"- {model_name} {tuple(pair)} {key}: {mine - theirs:+.2f} vs {rival}")
    return f"{ours}: >= the rival in {total - lost} of {total} comparisons\n" + "\n".join(lines)


if __name__ == "__main__":
    main()
