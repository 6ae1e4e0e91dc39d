import math

import torch

from snapvit_pl.search.population import evaluate_population, evaluate_shared
from threaded_ranks import as_ranks


def run_ranks(candidates, world, fitness, **kwargs):
    """Simulated DDP (one thread per rank); returns each rank's result and calls."""
    calls = {rank: [] for rank in range(world)}

    def work(rank, all_gather):
        def counted(x):
            calls[rank].append(int(x[0]))
            return fitness(x)

        return evaluate_population(candidates, counted, rank, world, all_gather, **kwargs)

    return as_ranks(world, work), calls


def test_split_across_ranks_evaluates_each_candidate_once():
    candidates = torch.arange(7.0).reshape(7, 1)
    square = lambda x: float(x[0]) ** 2  # noqa: E731
    results, calls = run_ranks(candidates, 3, square)
    expected = torch.arange(7.0, dtype=torch.float64) ** 2
    assert all(torch.equal(r, expected) for r in results)
    assert calls == {0: [0, 3, 6], 1: [1, 4], 2: [2, 5]}
    assert torch.equal(evaluate_population(candidates, square), expected)


def test_an_interrupted_generation_resumes_with_what_it_had_evaluated():
    candidates = torch.arange(6.0).reshape(6, 1)
    square = lambda x: float(x[0]) ** 2  # noqa: E731
    rounds = []
    evaluate_population(candidates, square, on_round=rounds.append)
    assert len(rounds) == 6 and math.isnan(float(rounds[1][2])) and float(rounds[1][1]) == 1.0
    saved = rounds[2].tolist()  # killed after three candidates; resumed on two ranks
    results, calls = run_ranks(candidates, 2, square, known=saved)
    assert all(torch.equal(r, torch.arange(6.0, dtype=torch.float64) ** 2) for r in results)
    assert calls == {0: [3, 5], 1: [4]}


def test_shared_jobs_are_evaluated_once_across_ranks_and_give_every_rank_the_single_process_results():
    sizes = [3, 1, 4, 2, 5]
    evaluated = []

    def evaluate(job):
        evaluated.append(job)
        return torch.arange(sizes[job], dtype=torch.float32) + 10 * job

    single = evaluate_shared(list(range(5)), evaluate, sizes, [float(s) for s in sizes])
    evaluated.clear()
    ranks = as_ranks(2, lambda rank, gather: evaluate_shared(list(range(5)), evaluate, sizes,
                                                              [float(s) for s in sizes], rank, 2, gather))
    assert sorted(evaluated) == list(range(5))  # each job on one rank only
    for results in ranks:
        assert all(torch.equal(a, b) for a, b in zip(results, single))
