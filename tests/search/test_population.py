import math
import threading

import torch

from snapvit_pl.search.population import evaluate_population


def run_ranks(candidates, world, fitness, **kwargs):
    """Simulated DDP: one thread per rank, all_gather through a barrier; returns each rank's result and calls."""
    slots, barrier = [None] * world, threading.Barrier(world)
    results, calls = [None] * world, {rank: [] for rank in range(world)}

    def worker(rank):
        def all_gather(t):
            slots[rank] = t.clone()
            barrier.wait()
            gathered = torch.stack(slots)
            barrier.wait()
            return gathered

        def counted(x):
            calls[rank].append(int(x[0]))
            return fitness(x)

        results[rank] = evaluate_population(candidates, counted, rank, world, all_gather, **kwargs)

    threads = [threading.Thread(target=worker, args=(rank,)) for rank in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, calls


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
