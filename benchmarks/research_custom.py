"""Issue 23 research: local scores that are not plain Scorers, and post-processing of the elastic scores.

The variants of :mod:`benchmarks.research_scores` (``python benchmarks/research_scores.py --help``) that
``snapvit_pl.scoring.build_scorer`` cannot build:

- ``CUSTOM`` (functions ``(setup, seed, **kwargs) -> LocalScores``): ``head_ablation`` (heads by exact
  single-head removal), ``iter_sens`` (iterative Gauss-Newton sensitivity on the network pruned so far),
  ``sens_pca`` (sensitivity in the fitness's PCA geometry), ``gram_greedy`` (the research version of the
  ``gn_greedy`` scorer);
- ``POST`` (functions ``(setup, scores, images, cost, log, **kwargs) -> ElasticScores``): ``split_search``
  (a coefficient search at the splits the export chooses);
- :func:`research_scorer`: ``build_scorer`` plus the ``target="predictions"`` option of ``sensitivity`` and
  ``gn_greedy`` (the true Fisher of the model's own classifier), which only branch quality-research's
  scorers have (:class:`PredictionSensitivity`, :class:`PredictionGaussNewtonGreedy` here).

Ported from branch quality-research (commit 95e5592) to the current API; the results in
``benchmarks/results/research/holdout.jsonl`` were measured with that version.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from snapvit_pl.elastic import PAPER_PAIRS, Budget, CostModel, ElasticScores
from snapvit_pl.elastic.ranking import min_kept
from snapvit_pl.models import Subnet, prunable_blocks, use_subnet
from snapvit_pl.pipeline import choose_splits, local_importance, run_search, scoring_views
from snapvit_pl.scoring import GaussNewtonGreedy, LocalScores, OutputSensitivity, Scorer, ScoringError, build_scorer
from snapvit_pl.scoring.sensitivity import unit_masks
from snapvit_pl.search.fitness import EmbeddingFitness


def sample_seeds(images: Tensor, seed: int) -> list[int]:
    """One seed per sample, from its pixels (and ``seed``): the probe stream the research results were computed with
    (the library's scorers now draw their probes on the device: ``snapvit_pl.scoring.sensitivity.probe_seeds``)."""
    import hashlib

    flat = images.detach().float().cpu().reshape(images.shape[0], -1).numpy()
    return [int(hashlib.sha1(row.tobytes() + str(seed).encode()).hexdigest()[:15], 16) for row in flat]

#: The search of ``configs/prune/demo.yaml`` at commit 95e5592 (what ``search: {}`` meant there): SNES, 80
#: evaluations, coefficients from 1.2 (first block) to 0.8 (last block). Today's defaults are no search and
#: coefficients 1, so the variants name these values.
OLD_DEMO_SEARCH: dict[str, Any] = {"max_evaluations": 80, "initial_range": (1.2, 0.8)}


def _plain_batches(setup):
    dm = setup.datamodule
    dm.train_views = "plain"
    return dm.train_dataloader()


def _fitness_images(setup):
    return setup.datamodule.unlabeled_images(setup.search.num_images, setup.search.batch_size)


def head_ablation(setup, seed: int, neuron_scorer: str = "sensitivity", probes: int = 8, **_: Any) -> LocalScores:
    """Heads: the fitness drift of removing each head alone (B x H pruned forwards over the fitness images);
    neurons: ``neuron_scorer``'s scores."""
    model = setup.model
    blocks = prunable_blocks(model)
    images = _fitness_images(setup)
    placeholder = ElasticScores([torch.ones(b.heads.num_units) for b in blocks], [torch.ones(b.neurons.num_units) for b in blocks])
    fitness = EmbeddingFitness(model, images, placeholder, setup.search, pairs=[(0.0, 0.0)])
    heads = []
    for b, block in enumerate(blocks):
        drift = []
        for h in range(block.heads.num_units):
            subnet = Subnet.full(model)
            subnet.heads[b] = torch.tensor([i for i in range(block.heads.num_units) if i != h])
            drift.append(fitness.distance(subnet))
        heads.append(torch.tensor(drift))
    kwargs = {"probes": probes} if neuron_scorer == "sensitivity" else {}
    scorer = build_scorer(neuron_scorer, **kwargs)
    batches = _plain_batches(setup) if neuron_scorer == "sensitivity" else None
    if batches is None:
        setup.datamodule.train_views = scoring_views(scorer)
        batches = setup.datamodule.train_dataloader()
    neurons = local_importance(scorer, model, batches).neurons
    return LocalScores(heads, neurons)


def iterative_sensitivity(setup, seed: int, rounds: int = 6, final_sparsity: float = 0.6, probes: int = 8,
                          max_images: int = 1000, **_: Any) -> LocalScores:
    """A nested ranking from ``rounds`` rounds of Gauss-Newton sensitivity on the network pruned so far.

    Each round scores the units still present (on the model cut to them), ranks heads and neurons together by
    sensitivity per parameter, and removes the cheapest until ``r / rounds * final_sparsity`` of the parameters
    are gone (the per-block minimum keep ratios protected, as in extraction). The returned scores are the
    removal order (units removed first score lowest; the survivors by their last sensitivity), so every budget
    is still one cut of one ranking per kind.
    """
    model = setup.model
    blocks = prunable_blocks(model)
    cost = CostModel(model)
    keep_h, keep_n = setup.importance.min_head_keep, setup.importance.min_mlp_keep
    alive_h = [list(range(b.heads.num_units)) for b in blocks]
    alive_n = [list(range(b.neurons.num_units)) for b in blocks]
    order_h: list[tuple[int, int]] = []  # (block, unit) in removal order
    order_n: list[tuple[int, int]] = []
    prunable_params = cost.dense_params
    removed_params = 0.0
    last_h: list[torch.Tensor] = []
    last_n: list[torch.Tensor] = []
    for r in range(1, rounds + 1):
        subnet = Subnet([torch.tensor(a) for a in alive_h], [torch.tensor(a) for a in alive_n])
        scorer = OutputSensitivity(probes=probes, seed=seed + r)
        with use_subnet(model, subnet):
            batches = _plain_batches(setup)
            scorer = scorer.bind(model)
            seen = 0
            for batch in batches:
                scorer.update(batch)
                seen += len(batch)
                if seen >= max_images:
                    break
            local = scorer.compute()
        last_h, last_n = local.heads, local.neurons
        target = r / rounds * final_sparsity * prunable_params
        candidates = []  # (value per parameter, kind, block, position in alive list)
        for b in range(len(blocks)):
            for kind, scores, alive, per, total, keep in (
                    ("h", local.heads[b], alive_h[b], cost.head_params[b], blocks[b].heads.num_units, keep_h),
                    ("n", local.neurons[b], alive_n[b], cost.neuron_params[b], blocks[b].neurons.num_units, keep_n)):
                protected = set(torch.argsort(scores, descending=True)[: min_kept(total, keep)].tolist())
                for i in range(len(alive)):
                    if i not in protected:
                        candidates.append((float(scores[i]) / per, kind, b, i, per))
        candidates.sort(key=lambda c: c[0])
        drop_h: dict[int, set[int]] = {}
        drop_n: dict[int, set[int]] = {}
        for value, kind, b, i, per in candidates:
            if removed_params + per > target:
                break
            removed_params += per
            (drop_h if kind == "h" else drop_n).setdefault(b, set()).add(i)
            (order_h if kind == "h" else order_n).append((b, (alive_h if kind == "h" else alive_n)[b][i]))
        if r == rounds:
            break
        alive_h = [[u for i, u in enumerate(a) if i not in drop_h.get(b, set())] for b, a in enumerate(alive_h)]
        alive_n = [[u for i, u in enumerate(a) if i not in drop_n.get(b, set())] for b, a in enumerate(alive_n)]
    # survivors (of the last round's scoring, not dropped in it) after the removed ones, by their last score
    def ranking(order, alive, last, sizes, drops_last):
        scores = [torch.zeros(n) for n in sizes]
        position = 0
        for b, u in order:
            position += 1
            scores[b][u] = position
        rest, removed = [], set(order)
        for b, units in enumerate(alive):
            for i, u in enumerate(units):
                if (b, u) not in removed:
                    rest.append((float(last[b][i]), b, u))
        offset = position + 1
        # survivors: above every removed unit, ordered by their last (global) sensitivity
        rest.sort(key=lambda t: t[0])
        for k, (_, b, u) in enumerate(rest):
            scores[b][u] = offset + k
        return scores

    heads = ranking(order_h, alive_h, last_h, [b.heads.num_units for b in blocks], None)
    neurons = ranking(order_n, alive_n, last_n, [b.neurons.num_units for b in blocks], None)
    return LocalScores(heads, neurons)


CUSTOM = {"head_ablation": head_ablation, "iter_sens": iterative_sensitivity}


def split_search(setup, scores: ElasticScores, images, cost, log, rounds: int = 1,
                 initial_range=OLD_DEMO_SEARCH["initial_range"],
                 max_evaluations: int = OLD_DEMO_SEARCH["max_evaluations"], **_: Any) -> ElasticScores:
    """A search whose fitness is evaluated at the splits the export uses: choose the splits of the four budgets
    with the current coefficients, search the coefficients on those (mlp, head) pairs, repeat ``rounds`` times.

    The search is the pruning config's (images, PCA, batch size, seed) with ``initial_range`` and
    ``max_evaluations`` (default: the pre-port demo search, 80 evaluations from 1.2 .. 0.8)."""
    budgets = [Budget(params=cost.params(scores.subnet(Budget(mlp_ratio=m, head_ratio=h), cost)[0]))
               for m, h in PAPER_PAIRS[-4:]]
    settings = replace(setup.search, initial_range=tuple(initial_range), max_evaluations=int(max_evaluations))
    export = replace(setup.export, split_grid=0)  # only these budgets' splits
    for r in range(rounds):
        choices = choose_splits(setup.model, images, scores, budgets, setup.search, export, cost)
        pairs = [(next(m for h, m, _ in c.candidates if h == c.head_ratio), c.head_ratio) for c in choices]
        log(f"    split search round {r + 1}: pairs {[(round(m, 3), round(h, 3)) for m, h in pairs]}")
        start = scores.coefficients
        result = run_search(setup.model, images, scores, replace(settings, sparsity_pairs=pairs, seed=settings.seed + r))
        log(f"    fitness {result.initial_fitness:.4f} -> {result.best_fitness:.4f}")
        if start is not None and r > 0:
            pass
        scores.coefficients = result.coefficients
    return scores


POST = {"split_search": split_search}


def pca_sensitivity(setup, seed: int, probes: int = 8, project: bool = True, images_for_pca: str = "fitness",
                    **_: Any) -> LocalScores:
    """Gauss-Newton sensitivity of the fitness's own geometry: embeddings centred by the dense mean and projected on
    the fitness's PCA basis (fitted on the dense embeddings of the fitness images), then L2-normalised."""
    import torch.nn.functional as F

    from snapvit_pl.models import embed
    from snapvit_pl.scoring.sensitivity import OutputSensitivity as Base
    from snapvit_pl.search.fitness import PCAProjection

    model = setup.model
    with torch.no_grad():
        dense = torch.cat([embed(model, b) for b in _fitness_images(setup).split(256)])
    pca = PCAProjection(dense, setup.search.pca_components)

    class Projected(Base):
        def _squared_gradients(self, images, labels):
            original = embed
            import snapvit_pl.scoring.sensitivity as module

            def projected(m, x):
                out = original(m, x).float()
                return pca(out) if project else out - pca.mean

            module.embed = projected
            try:
                return super()._squared_gradients(images, labels)
            finally:
                module.embed = original

    scorer = Projected(probes=probes, seed=seed)
    return local_importance(scorer, model, _plain_batches(setup))


CUSTOM["sens_pca"] = pca_sensitivity


def gram_greedy(setup, seed: int, probes: int = 8, max_sparsity: float = 0.7, block_diagonal: bool = False,
                by_cost: bool = True, **_: Any) -> LocalScores:
    """Greedy nested removal order under the full Gauss-Newton quadratic model of the embedding drift.

    The mask gradients of every unit (heads and neurons of all blocks) per sample and probe give the Gram
    ``G = E[g g^T]`` over all units: removing a set S drifts by ~ 1/2 * 1_S^T G 1_S (no cross-term dropped).
    Units are removed one at a time, each time the one whose removal adds least drift per parameter
    (``G_uu + 2 sum_{v in S} G_uv``), never more than a block's minimum keep ratio allows, until
    ``max_sparsity`` of the parameters are gone; the rest follow by their diagonal. Scores = removal order.
    """
    from snapvit_pl.models import embed
    from snapvit_pl.models.modes import eval_mode
    from snapvit_pl.scoring.base import grad_only
    from snapvit_pl.scoring.activation import output_layer  # noqa: F401
    import torch.nn.functional as F

    model = setup.model
    blocks = prunable_blocks(model)
    cost = CostModel(model)
    groups = [(f"{b.index}.{kind}", kind, getattr(b, kind)) for b in blocks for kind in ("heads", "neurons")]
    sizes = [g.num_units for _, _, g in groups]
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + s)
    total = offsets[-1]
    gram = torch.zeros(total, total, dtype=torch.float64)
    samples = 0
    with eval_mode(model), grad_only(model, []):
        for images in _plain_batches(setup):
            n = images.shape[0]
            masks = {key: torch.ones(n, g.num_units, requires_grad=True) for key, _, g in groups}
            with torch.enable_grad(), unit_masks(groups, masks):
                out = F.normalize(embed(model, images).float(), dim=-1)
                gens = [torch.Generator().manual_seed(s) for s in sample_seeds(images, seed)]
                leaves = [masks[key] for key, _, _ in groups]
                for k in range(probes):
                    r = torch.stack([torch.randn(out.shape[1], generator=g) for g in gens])
                    grads = torch.autograd.grad((out * r).sum(), leaves, retain_graph=k + 1 < probes)
                    flat = torch.cat(grads, dim=1).double()  # [n, total]
                    gram.addmm_(flat.T, flat)
            samples += n
    gram /= samples * probes
    if block_diagonal:
        mask = torch.zeros_like(gram, dtype=torch.bool)
        for b in range(len(blocks)):
            lo, hi = offsets[2 * b], offsets[2 * b + 2]
            mask[lo:hi, lo:hi] = True
        gram = torch.where(mask, gram, torch.zeros_like(gram))
    unit_cost = torch.cat([torch.full((g.num_units,), float(cost.head_params[i // 2] if kind == "heads" else cost.neuron_params[i // 2]))
                           for i, (_, kind, g) in enumerate(groups)]).double()
    if not by_cost:
        unit_cost = torch.ones_like(unit_cost)
    owner = torch.cat([torch.full((s,), i) for i, s in enumerate(sizes)])
    keep = [min_kept(g.num_units, setup.importance.min_head_keep if kind == "heads" else setup.importance.min_mlp_keep)
            for _, kind, g in groups]
    removable = torch.tensor([s - k for s, k in zip(sizes, keep)])
    diag = gram.diagonal().clone()
    cross = torch.zeros(total, dtype=torch.float64)
    alive = torch.ones(total, dtype=torch.bool)
    order = []
    budget = max_sparsity * cost.dense_params
    spent = 0.0
    while spent < budget:
        delta = (diag + 2 * cross) / unit_cost
        allowed = alive & (removable[owner] > 0)
        if not bool(allowed.any()):
            break
        delta[~allowed] = float("inf")
        u = int(torch.argmin(delta))
        order.append(u)
        alive[u] = False
        removable[owner[u]] -= 1
        cross += gram[:, u]
        spent += float(unit_cost[u]) if by_cost else float(
            cost.head_params[int(owner[u]) // 2] if groups[int(owner[u])][1] == "heads" else cost.neuron_params[int(owner[u]) // 2])
    score = torch.zeros(total, dtype=torch.float64)
    for position, u in enumerate(order):
        score[u] = position + 1
    rest = alive.nonzero().flatten()
    rest = rest[torch.argsort(diag[rest])]
    for k, u in enumerate(rest.tolist()):
        score[u] = len(order) + 1 + k
    parts = [score[offsets[i]:offsets[i + 1]].float() for i in range(len(groups))]
    return LocalScores(parts[0::2], parts[1::2])


CUSTOM["gram_greedy"] = gram_greedy


class _PredictionTarget:
    """``target="predictions"`` for the unit-mask scorers (quality-research's uncommitted ``sensitivity.py``,
    kept here because main's scorers have no such target): the true Fisher of the model's own predictive
    distribution, one label per probe drawn from the model's predictions (none from the data)."""

    def _probe_gradients(self, images: Tensor) -> Iterator[list[Tensor]]:
        if self.target != "predictions":
            yield from super()._probe_gradients(images)
            return
        if not getattr(self.model, "num_classes", 0):
            raise ScoringError("sensitivity target 'predictions' needs a classifier head; use target='normalized'")
        n = images.shape[0]
        masks = self._masks(n)
        count = max(self.probes, 1)
        with torch.inference_mode(False), torch.enable_grad(), unit_masks(self._groups, masks):
            log_p = F.log_softmax(self.model(images).float(), dim=-1)
            generators = [torch.Generator().manual_seed(s) for s in sample_seeds(images, self.seed)]
            probs = log_p.detach().exp().cpu().double()
            drawn = torch.stack([torch.stack([torch.multinomial(probs[i], 1, generator=g)[0]
                                              for i, g in enumerate(generators)])
                                 for _ in range(count)]).to(log_p.device)  # [K, n]
            leaves = [masks[key] for key, _, _ in self._groups]
            for k in range(count):
                chosen = log_p.gather(1, drawn[k][:, None]).sum()
                yield list(torch.autograd.grad(chosen, leaves, retain_graph=k + 1 < count))


class PredictionSensitivity(_PredictionTarget, OutputSensitivity):
    """:class:`OutputSensitivity` with ``target`` ``"normalized"``, ``"raw"`` or ``"predictions"``."""

    def __init__(self, probes: int = 8, target: str = "predictions", seed: int = 0, center: Optional[list] = None):
        super().__init__(probes=probes, seed=seed, center=center)
        if target not in ("normalized", "raw", "predictions"):
            raise ScoringError(f"sensitivity: target must be 'normalized', 'raw' or 'predictions', got {target!r}")
        self.target = target


class PredictionGaussNewtonGreedy(_PredictionTarget, GaussNewtonGreedy):
    """:class:`GaussNewtonGreedy` whose drift is measured on ``target`` (see :class:`PredictionSensitivity`)."""

    def __init__(self, probes: int = 8, gram: str = "full", seed: int = 0, target: str = "predictions",
                 cross_weight: float = 1.0):  # (measured before the default shrank the interaction terms)
        super().__init__(probes=probes, gram=gram, seed=seed, cross_weight=cross_weight)
        if target not in ("normalized", "raw", "predictions"):
            raise ScoringError(f"gn_greedy: target must be 'normalized', 'raw' or 'predictions', got {target!r}")
        self.target = target

    def config(self) -> dict[str, Any]:
        return {**super().config(), "target": self.target}

    def _gradients(self, images: Tensor):
        if self.target != "predictions":
            return super()._gradients(images)
        return torch.cat([torch.cat(g, dim=1) for g in self._probe_gradients(images)]), None


class ZerothOrderStagesGreedy(GaussNewtonGreedy):
    """Issue 46's ablation: :class:`GaussNewtonGreedy` whose later stages take the Gram again at the sub-network but
    drop the first-order term of the drift (as if the sub-network were the dense one)."""

    name = "gn_greedy_nolin"

    def _gradients(self, images: Tensor):
        rows, _ = super()._gradients(images)
        return rows, None


class LateStagesGreedy(GaussNewtonGreedy):
    """Issue 46: :class:`GaussNewtonGreedy` re-linearised only past ``start`` of the removable units (its later stages
    share the rest equally): the budgets before ``start`` are the one-shot order's."""

    name = "gn_greedy_late"

    def __init__(self, start: float = 0.7, **kwargs: Any):
        super().__init__(**kwargs)
        self.start = start

    def config(self) -> dict[str, Any]:
        return {**super().config(), "start": self.start}

    def _stage_end(self, stage: int) -> float:
        return self.start + (1 - self.start) * stage / max(1, self.stages - 1)


PREDICTION_SCORERS = {"sensitivity": PredictionSensitivity, "gn_greedy": PredictionGaussNewtonGreedy}
RESEARCH_SCORERS = {"gn_greedy_nolin": ZerothOrderStagesGreedy, "gn_greedy_late": LateStagesGreedy}


def research_scorer(name: str, **kwargs: Any) -> Scorer:
    """``build_scorer(name, **kwargs)``, with ``target="predictions"`` for ``sensitivity`` and ``gn_greedy``."""
    if kwargs.get("target") == "predictions" and name in PREDICTION_SCORERS:
        return PREDICTION_SCORERS[name](**kwargs)
    if name in RESEARCH_SCORERS:
        return RESEARCH_SCORERS[name](**kwargs)
    return build_scorer(name, **kwargs)
