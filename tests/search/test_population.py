import torch

from snapvit_pl.search.population import evaluate_population


def test_split_across_ranks_evaluates_each_candidate_once():
    candidates = torch.arange(7.0).reshape(7, 1)
    world = 3
    calls = {rank: [] for rank in range(world)}

    def local_share(rank):
        """Run one simulated rank; its all_gather just records what the rank contributed."""
        contributed = {}

        def fitness(x):
            calls[rank].append(int(x[0]))
            return float(x[0]) ** 2

        def record(t):
            contributed["local"] = t
            return t.repeat(world)

        evaluate_population(candidates, fitness, rank=rank, world_size=world, all_gather=record)
        return contributed["local"]

    shares = torch.stack([local_share(rank) for rank in range(world)])
    calls_before = {r: list(c) for r, c in calls.items()}
    result = evaluate_population(candidates, lambda x: float(x[0]) ** 2, rank=1, world_size=world, all_gather=lambda t: shares)
    assert torch.equal(result, torch.arange(7.0, dtype=torch.float64) ** 2)
    assert calls_before == {0: [0, 3, 6], 1: [1, 4], 2: [2, 5]}
    assert sorted(sum(calls_before.values(), [])) == list(range(7))
    assert torch.equal(evaluate_population(candidates, lambda x: float(x[0]) ** 2), result)
