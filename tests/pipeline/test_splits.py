from dataclasses import replace

import pytest
import torch

from families import FAMILIES, random_elastic_scores
from snapvit_pl.elastic import Budget, CostModel, ElasticScores
from snapvit_pl.models import load_backbone
from snapvit_pl.pipeline import (
    ExportSettings, ImportanceSettings, Pipeline, PipelineSettings, SearchSettings, TensorInputs, choose_splits,
    split_table,
)
from snapvit_pl.pipeline.splits import exhaustive_splits, split_candidates, split_points
from snapvit_pl.scoring import Magnitude
from snapvit_pl.search.fitness import EmbeddingFitness

BUDGETS = [Budget(sparsity=0.4), Budget(flops=0.5), Budget(mlp_ratio=0.35, head_ratio=0.2)]
SEARCH = SearchSettings(num_images=16, pca_components=8, batch_size=8)


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = load_backbone(FAMILIES["augreg_vit"])
    return model, torch.randn(16, 3, 32, 32), random_elastic_scores(model)


def test_candidates_surround_the_schedule_within_the_reachable_range():
    assert split_candidates(0.25, 5, 0.1, 0.8) == [0.05, 0.15, 0.25, 0.35, 0.45]
    assert split_candidates(0.05, 3, 0.1, 0.8) == [0.0, 0.05, 0.15]


def test_points_are_the_budgets_asked_for_then_the_grid_each_once(setup):
    model, _, _ = setup
    points = split_points(BUDGETS + [Budget(params=0.6)], CostModel(model), 0.25)  # params=0.6 is sparsity=0.4
    assert points == [("sparsity0.4", "params", 0.6, True), ("flops0.5", "flops", 0.5, True),
                      ("params0.75", "params", 0.75, False), ("flops0.75", "flops", 0.75, False),
                      ("params0.5", "params", 0.5, False), ("params0.25", "params", 0.25, False),
                      ("flops0.25", "flops", 0.25, False)]


def test_the_grid_keeps_every_other_point_above_one_half(setup):
    """Issue 55: the shallow half of the grid (kept fraction above GRID_COARSE_ABOVE) has every other point."""
    from snapvit_pl.pipeline.splits import GRID_COARSE_ABOVE

    model, _, _ = setup
    keeps = [keep for _, metric, keep, _ in split_points([], CostModel(model), 0.1) if metric == "params"]
    assert GRID_COARSE_ABOVE == 0.5 and keeps == [0.9, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1]
    asked = split_points([Budget(params=0.8)], CostModel(model), 0.1)  # a budget asked for is split wherever it is
    assert asked[0] == ("params0.8", "params", 0.8, True) and [k for _, m, k, _ in asked[1:] if m == "flops"] == keeps
    fine = [keep for _, metric, keep, _ in split_points([], CostModel(model), 0.05) if metric == "flops"]
    assert fine[:6] == [0.95, 0.85, 0.75, 0.65, 0.55, 0.5] and fine[6:9] == [0.45, 0.4, 0.35]


def test_the_split_with_the_least_drift_wins_deterministically_and_meets_the_budget(setup):
    model, images, scores = setup
    export = ExportSettings(split_candidates=5, split_grid=0)
    first, again = (choose_splits(model, images, scores, BUDGETS, SEARCH, export) for _ in range(2))
    assert [c.label for c in first] == ["sparsity0.4", "flops0.5"]  # a ratio pair fixes its own split
    assert [(c.head_ratio, c.candidates) for c in first] == [(c.head_ratio, c.candidates) for c in again]
    fitness = EmbeddingFitness(model, images, scores, SEARCH, pairs=[(0.0, 0.0)])
    cost = CostModel(model)
    recorded = ElasticScores(**{**vars(scores), "splits": split_table(first)})
    for choice, budget in zip(first, BUDGETS):
        assert choice.head_ratio == min(choice.candidates, key=lambda c: c[2])[0]
        assert any(h == pytest.approx(choice.schedule_head_ratio) for h, _, _ in choice.candidates)
        subnet, _, head_ratio = recorded.subnet(budget, cost)
        assert head_ratio == pytest.approx(choice.head_ratio)
        assert fitness.distance(subnet) == pytest.approx(min(d for _, _, d in choice.candidates), abs=1e-6)
    assert cost.params(recorded.subnet(BUDGETS[0], cost)[0]) <= 0.6 * cost.dense_params


def test_a_budget_between_grid_points_takes_the_interpolated_split(setup):
    model, images, scores = setup
    choices = choose_splits(model, images, scores, [], SEARCH, ExportSettings(split_candidates=5, split_grid=0.1))
    assert choices and all(not c.requested for c in choices)
    table = split_table(choices)
    recorded = ElasticScores(**{**vars(scores), "splits": table})
    cost = CostModel(model)
    (lo, h_lo), (hi, h_hi) = table.points["flops"][-2:]  # two neighbouring grid points
    middle = (lo + hi) / 2
    subnet, _, head_ratio = recorded.subnet(Budget(flops=middle), cost)
    assert head_ratio == pytest.approx((h_lo + h_hi) / 2) and cost.flops(subnet) <= middle * cost.dense_flops


def test_the_grid_reaches_the_deepest_cut_so_a_later_deep_budget_is_interpolated_not_extrapolated(setup):
    """Issue 55: below the grid's last point (0.2, say) and above the deepest cut the keep ratios allow (0.17), a
    budget cut later took the last grid point's split; the grid now ends a point just above the deepest cut."""
    from snapvit_pl.pipeline.splits import DEEP_END_MARGIN, deepest_keep

    model, images, scores = setup
    cost = CostModel(model)
    heads, neurons = scores.unified()
    deepest = deepest_keep(heads, neurons, cost, scores.min_mlp_keep, scores.min_head_keep)
    assert 0 < deepest["params"] < 0.5 and 0 < deepest["flops"] < 0.5
    points = split_points([], cost, 0.25, deepest)
    assert points[-2:] == [(f"params{round(deepest['params'] + DEEP_END_MARGIN, 4):g}", "params",
                            round(deepest["params"] + DEEP_END_MARGIN, 4), False),
                           (f"flops{round(deepest['flops'] + DEEP_END_MARGIN, 4):g}", "flops",
                            round(deepest["flops"] + DEEP_END_MARGIN, 4), False)]
    choices = choose_splits(model, images, scores, [], SEARCH, ExportSettings(split_candidates=5, split_grid=0.25))
    table = split_table(choices)
    (deep, h_deep), (last, h_last) = table.points["params"][:2]
    assert deep == pytest.approx(round(deepest["params"] + DEEP_END_MARGIN, 4)) and last > deep
    between = (deep + last) / 2
    expected = h_deep + (h_last - h_deep) * (between - deep) / (last - deep)
    assert table.head_ratio("params", between) == pytest.approx(expected)


def _pipeline(model, images, tmp_path, export):
    settings = PipelineSettings(importance=ImportanceSettings(Magnitude()), search=SearchSettings(
        max_evaluations=0, num_images=16, pca_components=8, batch_size=8), export=export)
    return Pipeline(model, settings, inputs=TensorInputs(images), run_dir=tmp_path, progress="off")


def test_the_scores_file_records_the_budgets_and_the_grid(setup, tmp_path):
    model, images, _ = setup
    export = ExportSettings(budgets=[b.to_dict() for b in BUDGETS[:2]], split_candidates=3, split_grid=0.25,
                            save_models=False)
    pipeline = _pipeline(model, images, tmp_path, export)
    pipeline.run()
    saved = ElasticScores.load(tmp_path / export.scores_file)
    assert len(saved.splits) == len(pipeline.state.splits) > 2  # the two budgets and the reachable grid points
    for item in pipeline.export():
        choice = next(c for c in pipeline.state.splits if c.label == item.label)
        assert item.requested_head_ratio == pytest.approx(choice.head_ratio)  # the split asked for...
        assert item.head_ratio == 1 - sum(item.subnet.head_counts) / sum(CostModel(model).num_heads)  # ...and the cut
    schedule = _pipeline(model, images, tmp_path / "schedule", ExportSettings(budgets=export.budgets, split="schedule"))
    schedule.run()
    assert len(ElasticScores.load(tmp_path / "schedule" / export.scores_file).splits) == 0


@pytest.fixture(scope="module")
def sensitivity_setup():
    """A tiny model, 64 fitness images, and its output-sensitivity scores (drift-valued: the first-order path applies)."""
    from snapvit_pl.scoring import OutputSensitivity

    torch.manual_seed(0)
    model = load_backbone(FAMILIES["dino_vit"]).eval()
    images = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    scorer = OutputSensitivity(probes=4).bind(model)
    scorer.update(images[:32])
    scorer.reduce(lambda t: t)
    local = scorer.compute()
    scores = ElasticScores(local.heads, local.neurons, settings={"scorer": {"name": scorer.name, **scorer.config()}})
    return model, images, scores


def test_raced_splits_are_the_exhaustive_choice_or_within_one_percent_and_grid_points_a_local_minimum(
        sensitivity_setup):
    """Issue 30's bar on a tiny model: racing (16 images first) and the confirmed first-order choice pick, for every
    budget asked for, what every candidate on every image picks, or a split whose drift is within 1% of it. A grid
    point races only the split next to the nearest asked budget's offset and its neighbours, moving on while a
    neighbour wins (issue 55: the grid's cost): its choice drifts no more than (within 1%) its nearest distinct
    neighbours on every image, a local minimum of the window (a grid that stopped at its start would fail); on this
    model another minimum of the window is lower at some point."""
    model, images, scores = sensitivity_setup
    cost = CostModel(model)
    export = ExportSettings(budgets=[{"sparsity": s} for s in (0.2, 0.4, 0.6)], split_grid=0.1, split_images=16)
    choices = choose_splits(model, images, scores, export.budgets, SEARCH, export, cost, grid_images=len(images))
    best = exhaustive_splits(EmbeddingFitness(model, images, scores, SEARCH), scores, export.budgets, export, cost)
    assert [c.label for c in choices] == list(best)
    for choice in choices:
        h, drift, drifts = best[choice.label]
        chosen = next(d for r, (d, *_) in drifts.items() if r == pytest.approx(choice.head_ratio))
        if choice.requested:
            assert choice.head_ratio == pytest.approx(h) or chosen <= 1.01 * drift, choice
            continue
        distinct = sorted({round(d, 12): r for r, (d, *_) in sorted(drifts.items(), reverse=True)}.items(),
                          key=lambda item: item[1])  # one head ratio per distinct drift (sub-network), in order
        ratios = [r for _, r in distinct]
        here = min(range(len(ratios)), key=lambda i: abs(drifts[ratios[i]][0] - chosen))
        for neighbour in (here - 1, here + 1):
            if 0 <= neighbour < len(ratios):
                assert chosen <= 1.01 * drifts[ratios[neighbour]][0], (choice, ratios[neighbour])
    assert any(0 < n < len(images) for c in choices for n in c.images)  # some candidates left the race early
    grid = [c for c in choices if not c.requested]
    assert any(len(c.candidates) < len(best[c.label][2]) for c in grid)  # not every grid window raced whole
    assert any(best[c.label][1] < next(d for r, (d, *_) in best[c.label][2].items()
                                       if r == pytest.approx(c.head_ratio)) for c in grid)  # another minimum exists


def test_the_grid_leaves_near_ties_unsettled_and_the_budgets_asked_for_race_as_before(sensitivity_setup):
    """Issue 55: a grid point's race ends once its leader is within GRID_INDIFFERENCE of the others' drift, and at
    ``split_images`` images (its splits only serve later budgets); the budgets asked for race exactly as without
    either."""
    model, images, scores = sensitivity_setup
    cost = CostModel(model)
    export = ExportSettings(budgets=[{"sparsity": s} for s in (0.2, 0.4, 0.6)], split_grid=0.1, split_images=16)
    everything = len(images)
    zoned = choose_splits(model, images, scores, export.budgets, SEARCH, export, cost, grid_images=everything)
    settled = choose_splits(model, images, scores, export.budgets, SEARCH, export, cost, grid_indifference=0.0,
                            grid_images=everything)
    capped = choose_splits(model, images, scores, export.budgets, SEARCH, replace(export, split_images=32), cost)
    asked = [(c.label, c.head_ratio, c.candidates, c.images) for c in zoned if c.requested]
    assert asked == [(c.label, c.head_ratio, c.candidates, c.images) for c in settled if c.requested]
    assert [c.label for c in zoned] == [c.label for c in settled] == [c.label for c in capped]

    def grid_images(choices):
        return sum(sum(c.images) for c in choices if not c.requested)

    assert grid_images(zoned) < grid_images(settled)
    assert max(n for c in zoned if not c.requested for n in c.images) > 32  # some near tie went on past 32 images
    # by default a grid point's race reads at most GRID_IMAGES (32); a sub-network past that was raced by a budget asked
    # for too (one evaluation, shared: the same drift)
    asked_drifts = {d for c in capped if c.requested for _, _, d in c.candidates}
    past = [(n, d) for c in capped if not c.requested for (_, _, d), n in zip(c.candidates, c.images) if n > 32]
    assert all(d in asked_drifts for _, d in past)
    assert len(past) < sum(n > 32 for c in zoned if not c.requested for n in c.images)
    assert max(n for c in capped if c.requested for n in c.images) > 32  # the budgets asked for: still settled


def test_the_search_and_the_splits_share_one_fitness(setup, tmp_path, monkeypatch):
    import snapvit_pl.pipeline.driver as driver

    built = []
    monkeypatch.setattr(driver, "EmbeddingFitness", lambda *a, **k: built.append(1) or EmbeddingFitness(*a, **k))
    model, images, _ = setup
    settings = PipelineSettings(importance=ImportanceSettings(Magnitude()), search=SearchSettings(
        max_evaluations=4, popsize=4, num_images=16, pca_components=8, batch_size=8),
        export=ExportSettings(budgets=[{"sparsity": 0.4}], split_grid=0.25, save_models=False))
    Pipeline(model, settings, inputs=TensorInputs(images), progress="off").run()
    assert built == [1]  # dense embeddings and PCA once per run


def test_a_budget_cut_later_with_the_runs_images_gets_the_split_asking_for_it_would_have(setup, tmp_path):
    """Issue 55: one ranking, any budget. A run asked for one shallow budget; budgets across the whole depth range,
    cut later from its scores with its fitness images, take the split a run asking for them chose (the fitness and
    split settings come from the scores: the later pipeline is built with the defaults); without images, the
    interpolated one (nothing raced)."""
    from snapvit_pl.pipeline.splits import deepest_keep

    model, images, _ = setup
    search = SearchSettings(max_evaluations=0, num_images=12, pca_components=6, batch_size=4)

    def run(budgets, folder):
        export = ExportSettings(budgets=budgets, split_candidates=5, split_step=0.07, split_images=6, split_grid=0.25,
                                save_models=False)
        settings = PipelineSettings(importance=ImportanceSettings(Magnitude()), search=search, export=export)
        pipeline = Pipeline(model, settings, inputs=TensorInputs(images), run_dir=tmp_path / folder, progress="off")
        pipeline.run()
        return pipeline, ElasticScores.load(tmp_path / folder / export.scores_file)

    _, scores = run([{"sparsity": 0.2}], "shallow")
    heads, neurons = scores.unified()
    floor = deepest_keep(heads, neurons, CostModel(model), scores.min_mlp_keep, scores.min_head_keep)["params"]
    later = [{"params": round(keep, 3)} for keep in torch.linspace(0.85, floor + 0.02, 6).tolist()]
    later += [{"flops": 0.63}, {"sparsity": 0.55}]
    assert all(not scores.splits.records(*Budget.parse(b).cost_point(CostModel(model))) for b in later)
    asked, _ = run(later, "asked")
    up_front = {c.label: c.head_ratio for c in asked.state.splits if c.requested}
    assert len(up_front) == len(later)

    cut_later = Pipeline.from_scores(model, scores, inputs=TensorInputs(images), progress="off")
    extracted = cut_later.export(later, evaluate_dense=False)
    assert {item.label: item.requested_head_ratio for item in extracted} == pytest.approx(up_front)
    assert [c.label for c in cut_later.state.splits] == list(up_front)  # raced once each, as asked budgets

    interpolated = Pipeline.from_scores(model, scores, progress="off")  # no images: the recorded grid
    for item in interpolated.export(later, evaluate_dense=False):
        metric, keep = item.budget.cost_point(CostModel(model))
        assert item.requested_head_ratio == pytest.approx(scores.splits.head_ratio(metric, keep))
    assert interpolated.state.splits == []


def test_a_budget_the_keep_ratios_cannot_reach_is_refused_in_the_words_it_was_asked_in(setup):
    """Issue 77: {sparsity: 0.99} was refused as 'params budget {params: 0.01} ...', the budget it reads as."""
    from snapvit_pl.errors import PruningSpecError

    model, images, scores = setup
    with pytest.raises(PruningSpecError, match=r"^sparsity budget \{sparsity: 0.99\} \(.*\) is too low, unreachable"):
        choose_splits(model, images, scores, [Budget(sparsity=0.99)], SEARCH, ExportSettings(split_grid=0))
