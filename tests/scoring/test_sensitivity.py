"""Mask-gradient scorers against per-sample computations through column-scaled weights; invariances; DDP."""
import copy

import pytest
import torch
import torch.nn.functional as F

from scoring_helpers import assert_scores, build, scores_of, two_process_scores, views
from snapvit_pl.models import embed
from snapvit_pl.scoring import OutputSensitivity, SSLMaskFisher, self_distillation_loss




def masked(model):
    """A copy whose proj / fc2 weight columns are scaled by per-unit masks (a second, independent masking)."""
    copy_ = copy.deepcopy(model)
    masks = []
    for block in copy_.blocks:
        for layer, size in ((block.attn.proj, block.attn.head_dim), (block.mlp.fc2, 1)):
            m = torch.ones(layer.in_features // size, dtype=layer.weight.dtype, requires_grad=True)
            weight = layer.weight.detach().clone()
            del layer.weight
            layer.weight = weight  # a plain tensor: recomputed below from the mask
            masks.append((layer, weight, m, size))
    return copy_, masks


def apply(masks):
    for layer, weight, m, size in masks:
        layer.weight = weight * m.repeat_interleave(size)[None, :]


def per_sample_squared(model, objective, samples):
    """sum_n (dL_n/dm)^2 per mask: one sample at a time, masks scaling the weight columns."""
    copy_, masks = masked(model)
    total = [torch.zeros_like(m, dtype=torch.float64) for *_, m, _ in masks]
    for n in range(len(samples)):
        for k, value in enumerate(objective(copy_, masks, samples[n], n)):
            grads = torch.autograd.grad(value, [m for *_, m, _ in masks], allow_unused=True, retain_graph=True)
            for t, g in zip(total, grads):
                t += g.double().square()
    return total


def split_scores(total, n, model):
    heads = [t / n for t in total[0::2]]
    neurons = [t / n for t in total[1::2]]
    return heads, neurons




@pytest.mark.parametrize("family", ["dino_vit", "eva02_separate_qkv", "vit_swiglu", "dinov2_swiglu_packed"])
def test_exact_sensitivity_matches_per_sample_jacobians(family):
    model = build(family).double().eval()
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))

    def objective(copy_, masks, image, n):
        apply(masks)
        f = F.normalize(embed(copy_, image[None]), dim=-1)[0]
        return [f[d] for d in range(f.shape[0])]  # every output dimension: sum of squares = ||J||^2

    heads, neurons = split_scores(per_sample_squared(model, objective, x), 3, model)
    assert_scores(scores_of(OutputSensitivity(probes=0), model, [x]), heads, neurons, rtol=1e-6)


def test_random_probes_estimate_the_exact_value():
    model, x = build("dino_vit").eval(), torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    exact = scores_of(OutputSensitivity(probes=0), model, [x])
    estimate = scores_of(OutputSensitivity(probes=256), model, [x])
    a, b = torch.cat(exact.heads + exact.neurons), torch.cat(estimate.heads + estimate.neurons)
    assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.95
    assert 0.8 < float(b.sum() / a.sum()) < 1.2


@pytest.mark.parametrize("family", ["dino_vit", "vit_swiglu"])
def test_ssl_mask_fisher_matches_per_sample_losses(family):
    model = build(family).double().eval()
    x = views(3, n_views=4).double()
    with torch.no_grad():
        target = embed(model, x[:, :2].flatten(0, 1)).view(3, 2, -1)

    def objective(copy_, masks, sample, n):
        apply(masks)
        student = embed(copy_, sample).view(1, 4, -1)
        return [self_distillation_loss(student, target[n:n + 1])]

    heads, neurons = split_scores(per_sample_squared(model, objective, x), 3, model)
    assert_scores(scores_of(SSLMaskFisher(), model, [x]), heads, neurons, rtol=1e-6)


@pytest.mark.parametrize("make", [lambda: OutputSensitivity(probes=3), SSLMaskFisher], ids=["sensitivity", "mask_fisher"])
def test_batching_order_and_shards_do_not_matter(make):
    model, x = build("dino_vit").double(), views(8).double()
    if isinstance(make(), OutputSensitivity):
        x = x[:, 0]
    one = scores_of(make(), model, [x])
    assert_scores(scores_of(make(), model, list(x.split([3, 5]))), one.heads, one.neurons, rtol=1e-9)
    assert_scores(scores_of(make(), model, list(x.split(2))[::-1]), one.heads, one.neurons, rtol=1e-9)
    assert_scores(two_process_scores(make, model, x, 2), one.heads, one.neurons, rtol=1e-9)


def test_model_left_as_found():
    model = build("dino_vit").train()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    for scorer, batch in ((OutputSensitivity(probes=2), views(2)[:, 0]), (SSLMaskFisher(), views(2))):
        scorer = scorer.bind(model)
        scorer.update(batch)
        assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
        assert all(p.grad is None for p in model.parameters())
        assert all(not m._forward_pre_hooks for m in model.modules())
        assert model.training


def exact_gram(model, x):
    """G = 1/n sum_n J_n^T J_n over all units (blocks in order, heads then neurons), from column-scaled weights."""
    copy_, masks = masked(model)
    leaves = [m for *_, m, _ in masks]
    total = sum(m.numel() for m in leaves)
    gram = torch.zeros(total, total, dtype=torch.float64)
    for image in x:
        apply(masks)
        f = F.normalize(embed(copy_, image[None]), dim=-1)[0]
        for d in range(f.shape[0]):
            g = torch.cat([t.double() for t in torch.autograd.grad(f[d], leaves, retain_graph=True)])
            gram += torch.outer(g, g)
    return gram / len(x), [m.numel() for m in leaves]


def naive_greedy(gram, sizes, costs, keep, per_step=1, cross_weight=1.0):
    """Remove, ``per_step`` at a time, the units adding least drift per parameter (the interaction terms weighted by
    ``cross_weight``; at most what each group may lose); the protected last by their diagonal."""
    owner = [i for i, n in enumerate(sizes) for _ in range(n)]
    left = [n - k for n, k in zip(sizes, keep)]
    removed = []
    alive = list(range(len(owner)))
    costs = torch.tensor(costs, dtype=torch.float64)
    while any(left[owner[u]] > 0 for u in alive):
        added = (gram.diagonal() + 2 * cross_weight * gram[:, removed].sum(dim=1)) / costs  # drift added, per parameter
        chunk = []
        for u in sorted((u for u in alive if left[owner[u]] > 0), key=lambda u: (float(added[u]), u)):
            if len(chunk) < per_step and left[owner[u]] > 0:
                chunk.append(u)
                left[owner[u]] -= 1
        removed += chunk
        alive = [u for u in alive if u not in chunk]
    order = removed + sorted(alive, key=lambda u: (float(gram[u, u]), u))
    score = torch.zeros(len(owner))
    for position, u in enumerate(order):
        score[u] = (position + 1) / len(owner)
    return score


def greedy_setup(family, seed=6):
    from snapvit_pl.elastic.ranking import min_kept
    from snapvit_pl.models import prunable_blocks
    from snapvit_pl.models.units import iter_slots

    model = build(family).double().eval()
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    gram, sizes = exact_gram(model, x)
    costs, keep = [], []
    for block in prunable_blocks(model):
        for group, ratio in ((block.heads, 0.2), (block.neurons, 0.05)):
            owned = sum(t.numel() for _, t in iter_slots(group) if isinstance(t, torch.nn.Parameter))
            costs += [owned / group.num_units] * group.num_units
            keep.append(min_kept(group.num_units, ratio))
    return model, x, gram, sizes, costs, keep


def flat(scores):
    return torch.cat([t for pair in zip(scores.heads, scores.neurons) for t in pair])


@pytest.mark.parametrize("gram_kind,cross_weight", [("full", 1.0), ("block", 1.0), ("full", 0.5), ("full", 0.0)])
@pytest.mark.parametrize("family", ["dino_vit", "vit_swiglu"])
def test_gn_greedy_matches_naive_gram_and_greedy(family, gram_kind, cross_weight):
    from snapvit_pl.scoring import GaussNewtonGreedy

    model, x, gram, sizes, costs, keep = greedy_setup(family)
    if gram_kind == "block":
        edges = torch.tensor([0] + sizes).cumsum(0)
        mask = torch.zeros_like(gram, dtype=torch.bool)
        for b in range(len(sizes) // 2):
            mask[edges[2 * b]:edges[2 * b + 2], edges[2 * b]:edges[2 * b + 2]] = True
        gram = torch.where(mask, gram, torch.zeros_like(gram))
    expected = naive_greedy(gram, sizes, costs, keep, cross_weight=cross_weight)
    got = scores_of(GaussNewtonGreedy(probes=0, gram=gram_kind, cross_weight=cross_weight), model, list(x.split([2, 1])))
    torch.testing.assert_close(flat(got), expected)


@pytest.mark.parametrize("max_steps", [2, 7])
def test_gn_greedy_in_chunks_removes_the_lowest_increments_of_each_step(max_steps):
    """Above ``max_steps`` removable units, each step removes the ``ceil(removable / max_steps)`` lowest increments
    (at most what each group may lose), exactly as the one-at-a-time greedy would pick them from that state."""
    import math

    from snapvit_pl.scoring import GaussNewtonGreedy

    model, x, gram, sizes, costs, keep = greedy_setup("dino_vit")
    per_step = math.ceil(sum(n - k for n, k in zip(sizes, keep)) / max_steps)
    expected = naive_greedy(gram, sizes, costs, keep, per_step=per_step, cross_weight=0.5)
    got = scores_of(GaussNewtonGreedy(probes=0, gram="full", max_steps=max_steps, cross_weight=0.5), model, [x])
    torch.testing.assert_close(flat(got), expected)


def test_gn_greedy_low_rank_at_full_rank_is_the_full_gram():
    """The Nystrom approximation ``Y (Omega^T Y)^+ Y^T`` with ``Y = G Omega`` is ``G`` itself when ``Omega`` has as
    many columns as there are units; at lower rank it is another, still nested order."""
    from snapvit_pl.models import prunable_blocks
    from snapvit_pl.scoring import GaussNewtonGreedy

    model, x = build("dino_vit").double().eval(), views(4, seed=3)[:, 0].double()
    units = sum(b.heads.num_units + b.neurons.num_units for b in prunable_blocks(model))
    full = scores_of(GaussNewtonGreedy(probes=0, gram="full", cross_weight=1.0), model, [x])
    low = scores_of(GaussNewtonGreedy(probes=0, gram="lowrank", rank=units, cross_weight=1.0), model, [x])
    torch.testing.assert_close(flat(low), flat(full))
    smaller = GaussNewtonGreedy(probes=0, gram="lowrank", rank=4).bind(model)
    smaller.update(x)
    smaller.reduce(lambda t: t)
    scores = flat(smaller.compute())
    assert smaller.resolved == ("lowrank", "as configured")
    assert sorted((scores * len(scores)).round().long().tolist()) == list(range(1, len(scores) + 1))


def test_gn_greedy_auto_keeps_the_full_gram_where_it_fits(monkeypatch):
    from snapvit_pl.scoring import GaussNewtonGreedy, gram

    model, x = build("dino_vit").double().eval(), views(2)[:, 0].double()
    spec = GaussNewtonGreedy(probes=1)
    scorer = spec.bind(model)
    assert scorer.resolved[0] == "full" and "within" in scorer.resolved[1]
    monkeypatch.setattr(gram, "FULL_GRAM_CPU_BYTES", 1000)
    scorer = spec.bind(model)
    assert scorer.resolved[0] == "lowrank" and "over" in scorer.resolved[1]
    assert set(scorer.state_dict()["accumulators"]) == {"gram", "sketch"}  # one flat block-row buffer


def test_gn_greedy_shards_and_protection():
    from snapvit_pl.elastic.ranking import select_subnet
    from snapvit_pl.scoring import GaussNewtonGreedy

    model, x = build("eva02_separate_qkv").double(), views(6)[:, 0].double()
    one = scores_of(GaussNewtonGreedy(probes=2), model, [x])
    ranks = [GaussNewtonGreedy(probes=2).bind(model), GaussNewtonGreedy(probes=2).bind(model)]
    for rank, shard in zip(ranks, (x[0::2], x[1::2])):
        rank.update(shard)
    sent = []
    ranks[1].reduce(lambda t: sent.append(t.clone()) or t)
    ranks[0].reduce(lambda t: t + sent.pop(0))
    assert_scores(ranks[0].compute(), one.heads, one.neurons, rtol=0)
    # the units no block may lose score highest in their block: the deepest cut keeps exactly them
    subnet = select_subnet(one.heads, one.neurons, 0.74, 0.49)
    for kept, scores in zip(subnet.heads + subnet.neurons, one.heads + one.neurons):
        top = torch.argsort(scores, descending=True)[: len(kept)]
        assert set(kept.tolist()) == set(top.tolist())


def test_gn_greedy_takes_its_floors_from_the_run_it_is_bound_in():
    from snapvit_pl.models.units import MIN_HEAD_KEEP, MIN_MLP_KEEP, min_kept
    from snapvit_pl.pipeline import ImportanceSettings, Pipeline, PipelineSettings
    from snapvit_pl.pipeline.importance import scoring_context
    from snapvit_pl.scoring import GaussNewtonGreedy
    from snapvit_pl.scoring.base import ScoringContext

    model, x = build("dino_vit").double(), views(4)[:, 0].double()
    alone = GaussNewtonGreedy(probes=1).bind(model)  # bound without a run: the one definition of the defaults
    assert (alone.context.min_mlp_keep, alone.context.min_head_keep) == (MIN_MLP_KEEP, MIN_HEAD_KEEP)
    with pytest.raises(TypeError):
        GaussNewtonGreedy(min_mlp_keep=0.05)  # no second knob
    assert set(GaussNewtonGreedy().config()) == {"probes", "gram", "rank", "cross_weight", "max_steps", "stages",
                                                 "correction_aware", "precision", "seed"}
    settings = PipelineSettings(importance=ImportanceSettings(GaussNewtonGreedy(probes=1), min_mlp_keep=0.5,
                                                             min_head_keep=0.5))
    assert scoring_context(Pipeline(model, settings)) == ScoringContext(min_mlp_keep=0.5, min_head_keep=0.5)
    scores = scores_of(GaussNewtonGreedy(probes=1), model, [x], context=ScoringContext(min_mlp_keep=0.5,
                                                                                         min_head_keep=0.5))
    for per_block in (scores.heads, scores.neurons):  # the greedy never removed a block's protected half: last
        protected = [torch.sort(s, descending=True).values[:min_kept(len(s), 0.5)] for s in per_block]
        rest = [torch.sort(s, descending=True).values[min_kept(len(s), 0.5):] for s in per_block]
        assert min(p.min() for p in protected) > max(r.max() for r in rest)


def test_each_batch_reports_the_running_drift_estimate_of_removing_one_unit():
    """What TensorBoard plots per batch for the default score: the mean second-order drift (1 - cos) of removing
    one head / one MLP neuron so far; close to the drift measured by removing each head in turn."""
    from snapvit_pl.models import Subnet, prunable_blocks, use_subnet

    model = build("dino_vit").double().eval()
    x = torch.randn(6, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    scorer = OutputSensitivity(probes=0).bind(model)
    first, running = scorer.update(x[:3]), scorer.update(x[3:])
    scorer.reduce(lambda t: t)
    scores = scorer.compute()
    assert running["drift_per_head"] == pytest.approx(float(torch.stack([h.mean() for h in scores.heads]).mean()) / 2)
    assert running["drift_per_neuron"] == pytest.approx(float(torch.stack([n.mean() for n in scores.neurons]).mean()) / 2)
    assert first["drift_per_head"] != running["drift_per_head"]  # a running estimate: every batch so far
    blocks = prunable_blocks(model)
    with torch.no_grad():
        dense = F.normalize(embed(model, x), dim=-1)
        measured = []
        for index, block in enumerate(blocks):
            for head in range(block.heads.num_units):
                heads = [torch.arange(b.heads.num_units) for b in blocks]
                heads[index] = torch.tensor([k for k in range(block.heads.num_units) if k != head])
                with use_subnet(model, Subnet(heads=heads, neurons=[torch.arange(b.neurons.num_units) for b in blocks])):
                    measured.append(float((1 - (F.normalize(embed(model, x), dim=-1) * dense).sum(-1)).mean()))
    assert running["drift_per_head"] == pytest.approx(sum(measured) / len(measured), rel=0.3)


def test_probe_seeds_depend_on_the_image_alone_and_probes_on_the_seed_alone():
    from snapvit_pl.scoring.sensitivity import gaussian_probes, probe_seeds

    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    seeds = probe_seeds(x, 0)
    assert torch.equal(probe_seeds(x[[4, 1]], 0), seeds[[4, 1]])  # any batch, any position
    assert len(set(seeds.tolist())) == 6 and not torch.equal(probe_seeds(x, 1), seeds)
    x[2, 0, 0, 0] += 1e-3  # one pixel changes that image's seed only
    assert (probe_seeds(x, 0) != seeds).tolist() == [False, False, True, False, False, False]
    probes = gaussian_probes(seeds, 3, 5)
    assert probes.shape == (3, 6, 5) and torch.equal(gaussian_probes(seeds[[3]], 2, 5), probes[:2, [3]])
    many = gaussian_probes(torch.arange(64), 16, 256).flatten()  # standard normal, uncorrelated
    assert abs(float(many.mean())) < 0.01 and abs(float(many.std()) - 1) < 0.01
    assert abs(float(torch.corrcoef(torch.stack([many[:-1], many[1:]]))[0, 1])) < 0.01


def test_batched_vector_jacobian_products_equal_one_pass_per_probe():
    from snapvit_pl.scoring.sensitivity import probe_vjps

    leaf, weight, probes = torch.randn(4, 3, requires_grad=True), torch.randn(3, 5), torch.randn(6, 4, 5)
    loop = list(probe_vjps(torch.tanh(leaf @ weight).sin(), [leaf], probes, batched=False))
    batched = list(probe_vjps(torch.tanh(leaf @ weight).sin(), [leaf], probes, batched=True))
    assert len(loop) == len(batched) == 6
    for a, b in zip(loop, batched):
        torch.testing.assert_close(a[0], b[0])


def test_gn_greedy_logs_the_drift_its_diagonal_estimates_as_the_per_unit_sensitivity_does():
    """The Gram's diagonal is OutputSensitivity's per-unit sum (the same probes): both log the same running drift."""
    from snapvit_pl.scoring import GaussNewtonGreedy

    model, x = build("dino_vit").double().eval(), views(4)[:, 0].double()
    logged = []
    for scorer in (OutputSensitivity(probes=2, seed=3), GaussNewtonGreedy(probes=2, seed=3)):
        scorer = scorer.bind(model)
        scorer.update(x[:2])
        logged.append(scorer.update(x[2:]))
    assert set(logged[1]) == {"drift_per_head", "drift_per_neuron"}
    for key in logged[1]:
        assert logged[1][key] == pytest.approx(logged[0][key], rel=1e-9) and logged[1][key] > 0


def test_gn_greedy_without_interactions_cuts_what_the_per_unit_sensitivity_cuts():
    """``cross_weight=0``: each unit's own drift per parameter. With every block the same width, that ranks each kind
    as OutputSensitivity does, so both cut the same sub-networks (the ablation the interaction terms are judged by)."""
    from snapvit_pl.elastic.ranking import select_subnet
    from snapvit_pl.scoring import GaussNewtonGreedy

    model, x = build("dino_vit").double().eval(), views(6, seed=5)[:, 0].double()
    plain = scores_of(OutputSensitivity(probes=3, seed=2), model, [x])
    greedy = scores_of(GaussNewtonGreedy(probes=3, seed=2, cross_weight=0.0), model, [x])
    for mlp_ratio, head_ratio in ((0.3, 0.2), (0.65, 0.5), (0.9, 0.75)):
        a = select_subnet(plain.heads, plain.neurons, mlp_ratio, head_ratio)
        b = select_subnet(greedy.heads, greedy.neurons, mlp_ratio, head_ratio)
        assert [sorted(t.tolist()) for t in a.heads + a.neurons] == [sorted(t.tolist()) for t in b.heads + b.neurons]
