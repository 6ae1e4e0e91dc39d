"""The Gauss-Newton greedy's order at the device's pace: no host synchronisation inside its loop, exact lowest-k
selection with group caps, a clear error instead of a spin when no candidate is left (issue 45). Its agreement with
a naive greedy on exact Grams is in test_sensitivity.py."""
import math

import pytest
import torch

from snapvit_pl.device import HostSyncs
from snapvit_pl.errors import DataError
from snapvit_pl.pipeline.importance import local_importance
from snapvit_pl.scoring import GaussNewtonGreedy, OutputSensitivity, gram
from snapvit_pl.scoring.gram import (
    BlockRowGram, GreedyError, LowRankGram, Segments, _lowest, greedy_order, greedy_positions,
)

from scoring_helpers import build, views


def synthetic(form: str, blocks: int = 3, heads: int = 4, neurons: int = 24, dtype=torch.float32, seed: int = 0):
    sizes = [heads + neurons] * blocks
    layout = LowRankGram(sizes, 6, 0) if form == "lowrank" else BlockRowGram(sizes, form == "full")
    state = layout.zeros(dtype, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    layout.accumulate(state, (torch.randn(16, sum(sizes), generator=generator)
                              * torch.rand(sum(sizes), generator=generator)).to(dtype))
    group = torch.cat([torch.full((n,), i) for i, n in enumerate([heads, neurons] * blocks)])
    cost = torch.cat([torch.full((n,), c, dtype=torch.float64) for n, c in [(heads, 64.0), (neurons, 8.0)] * blocks])
    removable = torch.tensor([heads - 1, neurons - 2] * blocks)
    return layout, state, cost, group, removable


@pytest.mark.parametrize("form", ["full", "block", "lowrank"])
def test_the_greedy_order_syncs_a_constant_number_of_times_not_once_per_step(form, monkeypatch):
    """The host waits for the device a fixed number of times per order (index maps, the final check and copy), the
    same for 3 steps and for 69: a synchronisation inside the loop (``int(t)``, ``.item()``, a boolean mask,
    ``bincount``, ``.cpu()``, ``nonzero``) makes the counts differ and fails this test. (Counted on the path an
    accelerator takes: the CPU's shortcut reads a value back each step, which costs nothing there.)"""
    monkeypatch.setattr(gram, "CPU_SHORTCUT", False)
    counts = []
    for steps in (3, 69):
        layout, state, cost, group, removable = synthetic(form)
        with HostSyncs() as syncs:
            greedy_positions(layout, state, cost, group, removable, steps, 0.5)
        counts.append((syncs.count, dict(syncs.operators)))
    assert counts[0][0] == counts[1][0] and counts[0][0] <= 10, counts


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_greedy_loop_never_waits_for_the_gpu():  # pragma: no cover - GPU machines only
    layout, state, cost, group, removable = synthetic("full")
    state = {k: v.cuda() for k, v in state.items()}
    layout.maps(torch.device("cuda"))  # built once, outside the loop
    count = int(removable.sum())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):  # the one check after the loop, and nothing before it
            greedy_order(layout, state, cost.cuda(), group.cuda(), removable.cuda(), count, 4, 0.5)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_update_never_waits_for_the_device_and_its_log_is_read_when_shown():
    """Issue 51: a batch of the importance pass neither reads back from the device (its logged drift stays a 0-d
    tensor until shown) nor copies to it blocking (the images go non-blocking; the units present, once per stage)."""
    model = build("dino_vit").eval()
    scorer = GaussNewtonGreedy(probes=2).bind(model)
    batch = views(2)[:, 0]
    scorer.update(batch)  # the first batch of a stage moves the units present to the device, once
    with HostSyncs(device="cpu") as syncs:
        metrics = scorer.update(batch)
    assert syncs.count == 0, syncs.operators
    assert set(metrics) == {"drift_per_head", "drift_per_neuron"}
    assert all(v.dim() == 0 and math.isfinite(float(v)) for v in metrics.values())


@pytest.mark.parametrize("scorer", [GaussNewtonGreedy(probes=2, stages=2), OutputSensitivity(probes=2)],
                         ids=["gn_greedy", "sensitivity"])
def test_the_importance_pass_waits_for_the_device_a_constant_number_of_times_not_once_per_batch(scorer):
    """The whole pass as the pipeline runs it (``local_importance``; every stage of a 2-stage greedy): the waits
    (reads back and blocking copies to the device) are the same for 2 batches and for 6."""
    model = build("dino_vit").eval()
    counts = []
    for batches in (2, 6):
        data = [views(2, seed=b)[:, 0] for b in range(batches)]
        with HostSyncs(device="cpu") as syncs:
            local_importance(scorer, model, data)
        counts.append((syncs.count, dict(syncs.operators)))
    assert counts[0][0] == counts[1][0], counts


def test_non_finite_statistics_name_their_first_batch_at_the_end_of_the_pass():
    model = build("dino_vit").eval()
    good = views(2)[:, 0]
    bad = good.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(DataError, match=r"gn_greedy: non-finite mask gradients \(batch 2\)"):
        local_importance(GaussNewtonGreedy(probes=2), model, [good, bad, good, bad])


@pytest.mark.parametrize("shortcut", [True, False])
@pytest.mark.parametrize("trial", range(20))
def test_the_lowest_units_with_group_caps_are_those_a_stable_sort_picks(trial, shortcut, monkeypatch):
    """float32 increments with ties, negative zeros, negatives and infinities: the chosen units and their order are
    a stable sort's (value, then index), at most ``left[g]`` of group ``g``."""
    monkeypatch.setattr(gram, "CPU_SHORTCUT", shortcut)
    generator = torch.Generator().manual_seed(trial)
    sizes = [3, 9, 3, 9, 5]
    values = torch.randint(-3, 4, (sum(sizes),), generator=generator).float() / 2
    values[torch.randint(0, len(values), (4,), generator=generator)] = -0.0
    values[torch.randint(0, len(values), (3,), generator=generator)] = torch.inf
    left = torch.randint(0, 4, (len(sizes),), generator=generator)
    group = torch.cat([torch.full((n,), g) for g, n in enumerate(sizes)])
    size = int(torch.randint(1, 8, (1,), generator=generator))
    expected, taken = [], [0] * len(sizes)
    for u in sorted(range(len(values)), key=lambda u: (float(values[u]), u)):
        if len(expected) < size and taken[group[u]] < left[group[u]]:
            expected.append(u)
            taken[group[u]] += 1
    segments = Segments(sizes, torch.device("cpu"))
    for dtype in (torch.float32, torch.float64):  # topk over sortable keys; a stable sort
        chunk, finite = _lowest(values.to(dtype), size, segments, left, group)
        complete = len(expected) == size and all(math.isfinite(values[u]) for u in expected)
        assert bool(finite) == complete
        if complete:
            assert chunk.tolist() == expected


@pytest.mark.parametrize("form", ["full", "block", "lowrank"])
def test_the_cpu_shortcut_gives_the_order_of_the_capped_pick(form, monkeypatch):
    """Issue 51: the CPU's shortcuts (an uncapped top-k, kept when no group exceeds what it may lose; one unit per
    step read from the dense Gram) change no order, with the caps binding (few removable units) and not."""
    for scale, steps in [(1, 23), (3, 23), (1, 10**6), (3, 10**6)]:  # 10**6 steps: one unit per step
        layout, state, cost, group, removable = synthetic(form)
        removable = removable // scale
        orders = []
        for shortcut in (True, False):
            monkeypatch.setattr(gram, "CPU_SHORTCUT", shortcut)
            orders.append(greedy_positions(layout, state, cost, group, removable, steps, 0.5))
        assert torch.equal(orders[0], orders[1]), (scale, steps)


@pytest.mark.parametrize("form", ["full", "lowrank"])
def test_no_finite_candidate_left_is_one_error_not_an_endless_loop(form):
    layout, state, cost, group, removable = synthetic(form)
    cost[group == 1] = 0.0  # units without parameters: every increment of block 0's neurons is infinite
    state["gram"][:] = 0
    with pytest.raises(GreedyError, match="finite removal increment"):
        greedy_positions(layout, state, cost, group, removable, 8, 1.0)


def test_the_float32_and_float64_paths_order_a_float32_gram_alike():
    """The float32 path (keys + topk) and the float64 path (ranks + stable sort) on the same increments."""
    layout, state, cost, group, removable = synthetic("full", dtype=torch.float32, seed=3)
    order32 = greedy_order(layout, state, cost, group, removable, int(removable.sum()), 5, 0.5)
    exact = {k: v.double() for k, v in state.items()}
    order64 = greedy_order(layout, exact, cost, group, removable, int(removable.sum()), 5, 0.5)
    agree = (order32 == order64).float().mean()
    assert agree > 0.9  # the same order but where float32 rounding swaps near-ties
    assert sorted(order32.tolist()) == sorted(order64.tolist())


def test_the_run_drops_its_scorer_and_gram_once_the_scores_exist():
    """The pipeline binds a fresh scorer to the model for the pass and drops it once the local scores exist: the
    settings' scorer stays a configuration, and nothing holds the Gram after the importance stage."""
    import gc
    import weakref

    from snapvit_pl.pipeline import ImportanceSettings, Pipeline, PipelineSettings

    model = build("dino_vit").eval()
    pipeline = Pipeline(model, PipelineSettings(importance=ImportanceSettings(GaussNewtonGreedy(probes=1))),
                        progress="off")
    pipeline.start_importance(1)
    pipeline.importance_step(views(2)[:, 0])
    gram = weakref.ref(pipeline.work.importance_pass.scorer._acc["gram"])
    pipeline.finish_importance()
    gc.collect()
    assert pipeline.work.importance_pass is None and gram() is None
    assert not hasattr(pipeline.settings.importance.scorer, "_acc")
    assert pipeline.state.method["scorer"]["gram_used"] == "full"
