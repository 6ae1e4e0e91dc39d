import copy

import pytest
import torch

from families import FAMILIES, random_elastic_scores
from snapvit_pl.elastic import initial_coefficients
from snapvit_pl.errors import ConfigError
from snapvit_pl.models import load_backbone
from snapvit_pl.pipeline import SearchProgress, SearchSettings, run_search, search_snapshots

SMALL = dict(num_images=24, batch_size=12, pca_components=8, popsize=4)


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = load_backbone(FAMILIES["dino_vit"])
    return model, torch.randn(24, 3, 32, 32), random_elastic_scores(model)


def test_no_evaluations_keeps_the_initial_coefficients(setup):
    model, images, scores = setup
    result = run_search(model, images, scores, SearchSettings(max_evaluations=0, **SMALL))
    assert torch.equal(result.coefficients, initial_coefficients(2, [4, 4], *SearchSettings().initial_range))
    assert result.evaluations == 0 and result.best_fitness is None and not result.improved_on_initial


def test_search_reports_its_progress_and_never_returns_worse_than_the_start(setup):
    model, images, scores = setup
    seen = []
    result = run_search(model, images, scores, SearchSettings(max_evaluations=10, **SMALL),
                        on_generation=lambda es, candidates, values: seen.append((es.evaluations, len(values))))
    assert seen == [(4, 4), (8, 4), (10, 2)]  # the last generation is cut to the budget
    assert result.evaluations == 10 and result.generations == 3 and result.evaluations_per_rank == [10]
    assert result.best_fitness <= result.initial_fitness and len(result.history) == 3
    assert result.forward_s > 0


@pytest.mark.parametrize("where", ["generation boundary", "mid-generation"])
def test_resumed_search_equals_an_uninterrupted_one(setup, where):
    model, images, scores = setup
    settings = SearchSettings(max_evaluations=12, **SMALL)
    saved = []
    straight = run_search(model, images, scores, settings, on_progress=saved.append)
    assert len(saved) == 12 + 3  # after every evaluation, and at the end of each of the 3 generations
    point = saved[4] if where == "generation boundary" else saved[6]  # after generation 1 / two into generation 2
    assert (point.pending is None) == (where == "generation boundary")
    restored = SearchProgress.from_dict(point.to_dict())  # as read back from resume_state.pt
    calls = []
    resumed = run_search(model, images, scores, settings, resume=restored,
                         on_generation=lambda es, candidates, values: calls.append(len(values)))
    assert torch.equal(resumed.coefficients, straight.coefficients)
    assert resumed.best_fitness == straight.best_fitness and resumed.history == straight.history
    assert resumed.resumed_at == (4 if where == "generation boundary" else 6)
    assert resumed.evaluations_per_rank == [12] and resumed.seconds >= point.seconds


def test_snapshots_continue_one_search(setup):
    model, images, scores = setup
    snapshots = search_snapshots(model, images, scores, SearchSettings(**SMALL), [0, 4, 8])
    straight = run_search(model, images, scores, SearchSettings(max_evaluations=8, **SMALL))
    assert snapshots[0].evaluations == 0 and snapshots[4].evaluations == 4
    assert torch.equal(snapshots[8].coefficients, straight.coefficients)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_evaluations=-5), "search.max_evaluations must be an integer >= 0, got -5"),
    (dict(popsize=1), "search.popsize must be an integer >= 2, got 1"),
    (dict(sigma=0.0), "search.sigma must be a number > 0, got 0.0"),
    (dict(sparsity_pairs=[]), "at least one"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        SearchSettings(**kwargs)


def test_a_time_budget_stops_the_search_in_time(setup):
    model, images, scores = setup
    import time

    started = time.perf_counter()
    result = run_search(model, images, scores, SearchSettings(max_evaluations=10_000, max_time=1.5, **SMALL))
    elapsed = time.perf_counter() - started
    assert result.stopped_by == "max_time" and 0 < result.evaluations < 10_000
    assert elapsed < 1.5 + 0.5  # the last generation was predicted to fit; setup is included in the budget


def test_log_search_keeps_coefficients_positive_and_paper_settings_are_named(setup):
    model, images, scores = setup
    result = run_search(model, images, scores, SearchSettings(max_evaluations=8, sigma=2.0, **SMALL))
    assert bool((result.coefficients > 0).all())
    paper = SearchSettings.paper()
    assert (paper.optimizer, paper.sigma, paper.parametrization, paper.popsize, paper.max_evaluations) == \
        ("xnes", 1.0, "linear", None, 50)
    with pytest.raises(ConfigError, match="optimizer must be one of"):
        SearchSettings(optimizer="cma")


def test_progress_counts_each_evaluation_once_on_any_number_of_ranks(setup, monkeypatch):
    """Two ranks, three candidates per generation: the last round of each generation has one candidate for two
    ranks; the bar counts what was evaluated (6 of 6), never a rank that sat the round out."""
    from threaded_ranks import as_ranks
    import snapvit_pl.search.loop as loop

    model, images, scores = setup
    counted = []

    class Recorded:
        def __init__(self, stage, total, mode, **kwargs):
            self.total, self.done, self.on = total, kwargs.get("initial", 0), mode != "off"

        def update(self, n=1, **metrics):
            self.done += n

        def set(self, **metrics):
            pass

        def close(self):
            if self.on:
                counted.append((self.done, self.total))

    monkeypatch.setattr(loop, "Progress", Recorded)
    settings = SearchSettings(max_evaluations=6, **{**SMALL, "popsize": 3})
    models = [copy.deepcopy(model) for _ in range(2)]  # (each rank its own: a candidate is cut in place)
    results = as_ranks(2, lambda rank, all_gather: run_search(models[rank], images, scores, settings, rank=rank,
                                                              world_size=2, all_gather=all_gather, progress="lines"))
    assert counted == [(6, 6)] and [r.evaluations for r in results] == [6, 6]
    assert results[0].evaluations_per_rank == [4, 2]
