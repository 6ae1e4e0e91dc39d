"""Racing sub-networks by drift: early exits, shared evaluations, the first-order favourite, DDP ranks."""
import torch

from snapvit_pl.models import Subnet
from snapvit_pl.search.race import MIN_IMAGES, Entrant, Race, Racer, race_order
from threaded_ranks import as_ranks


class TableFitness:
    """A fitness whose per-image cosines are given (one row per sub-network, keyed by its first head count)."""

    def __init__(self, rows: dict[int, torch.Tensor]):
        self.rows, self.calls = rows, []
        self.images = torch.zeros(len(next(iter(rows.values()))), 1, 1, 1)

    def similarities(self, subnet, index):
        self.calls.append((subnet.head_counts[0], len(index)))
        return self.rows[subnet.head_counts[0]][index]


def entrant(heads: int, tie: float = 0.0) -> Entrant:
    return Entrant(Subnet.from_counts([heads], [4]), cost=1.0, tie=tie, label=heads)


def rows(n: int = 256, seed: int = 0, **means: float) -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    noise = 0.01 * torch.randn(n, generator=g)  # shared by every row: the comparisons are paired
    return {int(k[1:]): 1 - m + noise + 0.002 * torch.randn(n, generator=g) for k, m in means.items()}


def test_every_prefix_of_the_race_order_is_spread_over_the_images():
    order = race_order(16)
    assert sorted(order.tolist()) == list(range(16))
    assert order[:4].tolist() == [0, 8, 4, 12]
    assert sorted(race_order(10).tolist()) == list(range(10))


def test_a_clearly_worse_entrant_leaves_after_the_first_round_and_close_ones_see_every_image():
    fitness = TableFitness(rows(h1=0.01, h2=0.20, h3=0.01001))
    racer = Racer(fitness, first_images=32)
    race = Race([entrant(1), entrant(2), entrant(3)])
    racer.run([race])
    assert racer.seen(entrant(2)) == 32  # 20x the drift: gone after one round
    assert racer.seen(entrant(1)) == racer.seen(entrant(3)) == 256  # within the noise: decided on every image
    everything = {k: 1 - float(v.mean()) for k, v in fitness.rows.items()}
    assert race.winner.label == min((1, 3), key=everything.get)  # what every image decides
    assert racer.image_evaluations == 32 + 2 * 256


def test_a_near_tie_inside_the_indifference_zone_ends_early_and_a_wider_gap_is_still_settled():
    near = rows(h1=0.0100, h3=0.0101)  # 1% apart: the exhaustive comparison needs every image
    settled = Race([entrant(1), entrant(3)], first_images=MIN_IMAGES)
    Racer(TableFitness(near), first_images=64).run([settled])
    zoned = Race([entrant(1), entrant(3)], first_images=MIN_IMAGES, indifference=0.05)
    racer = Racer(TableFitness(near), first_images=64)
    racer.run([zoned])
    assert settled.images == 256 and zoned.images < 256
    leader = min((1, 3), key=lambda k: racer.drift(entrant(k), zoned.images))
    assert zoned.winner.label == leader  # the leader when it stopped, at most 5% (at the race's z) worse
    apart = rows(h1=0.0100, h3=0.0125)  # 25% apart: outside the zone, decided by the paired test as without it
    for indifference in (0.0, 0.05):
        race = Race([entrant(1), entrant(3)], first_images=MIN_IMAGES, indifference=indifference)
        Racer(TableFitness(apart), first_images=64).run([race])
        assert race.winner.label == 1


def test_a_race_with_a_last_round_ends_there_and_the_least_drift_on_its_images_wins():
    near = rows(h1=0.0100, h2=0.20, h3=0.0101)  # 1 and 3 within the noise: without a last round, every image
    racer = Racer(TableFitness(near), first_images=64)
    capped = Race([entrant(1), entrant(2), entrant(3)], first_images=MIN_IMAGES, last_images=48)
    racer.run([capped])
    assert capped.images == 48 and racer.seen(entrant(1)) == racer.seen(entrant(3)) == 48  # 16, 32, then 48
    assert racer.seen(entrant(2)) == MIN_IMAGES  # 20x the drift: gone after the first round, as without the cap
    assert capped.winner.label == min((1, 3), key=lambda k: racer.drift(entrant(k), 48))
    pair = rows(h1=0.0100, h3=0.0101)  # the near tie that needs every image without a last round (above)
    small = Race([entrant(1), entrant(3)], first_images=MIN_IMAGES, last_images=8)  # below the first round
    Racer(TableFitness(pair), first_images=64).run([small])
    assert small.images == 8 and small.rounds == 1
    uncapped = Race([entrant(1), entrant(3)], first_images=MIN_IMAGES, last_images=10_000)  # beyond the fitness set
    Racer(TableFitness(pair), first_images=64).run([uncapped])
    assert uncapped.images == 256


def test_a_negative_indifference_or_an_empty_last_round_is_refused():
    import pytest

    with pytest.raises(ValueError, match="indifference must be at least 0"):
        Race([entrant(1)], indifference=-0.05)
    with pytest.raises(ValueError, match="last_images must be at least 1"):
        Race([entrant(1)], last_images=0)


def test_identical_sub_networks_are_evaluated_once_and_ties_go_to_the_preferred():
    fitness = TableFitness(rows(h1=0.05, h2=0.2))
    racer = Racer(fitness, first_images=64)
    races = [Race([entrant(1, tie=0.3), entrant(1, tie=0.1), entrant(2)]), Race([entrant(1), entrant(2)])]
    racer.run(races)
    assert [r.winner.label for r in races] == [1, 1] and races[0].winner.tie == 0.1
    assert sorted(fitness.calls) == [(1, 64), (2, 64)]  # one evaluation per sub-network, whatever the races


def test_a_favourite_that_leads_the_first_round_wins_at_once_else_the_race_goes_on():
    fitness = TableFitness(rows(h1=0.010, h2=0.0108))  # 1 leads after 16 images, not yet significantly
    racer = Racer(fitness, first_images=64)
    confirmed = Race([entrant(1), entrant(2)], first_images=MIN_IMAGES, favourite=entrant(1))
    racer.run([confirmed])
    assert confirmed.winner.label == 1 and racer.seen(entrant(2)) == MIN_IMAGES
    plain = Race([entrant(1), entrant(2)], first_images=MIN_IMAGES)  # the same race without a favourite goes on
    Racer(TableFitness(fitness.rows), first_images=64).run([plain])
    assert plain.rounds > 1
    overturned = Race([entrant(1), entrant(2)], first_images=MIN_IMAGES, favourite=entrant(2))
    Racer(TableFitness(fitness.rows), first_images=64).run([overturned])
    assert overturned.winner.label == 1


def test_a_decided_race_can_be_reopened_with_more_entrants():
    fitness = TableFitness(rows(h1=0.05, h2=0.04, h3=0.01))
    racer = Racer(fitness, first_images=32)
    race = Race([entrant(1), entrant(2)])
    racer.run([race], reopen=lambda r: [entrant(3)] if r.winner.label == 2 else [])
    assert race.winner.label == 3


def test_races_on_two_ranks_decide_as_one_process():
    def race_all(rank=0, gather=None, world=1):
        fitness = TableFitness(rows(h1=0.01, h2=0.2, h3=0.01001, h4=0.05))
        racer = Racer(fitness, first_images=32, rank=rank, world_size=world, all_gather=gather)
        races = [Race([entrant(1), entrant(2), entrant(3)]), Race([entrant(2), entrant(4)])]
        racer.run(races)
        return [r.winner.label for r in races], {k: v.clone() for k, v in racer.values.items()}, len(fitness.calls)

    single = race_all()
    ranks = as_ranks(2, lambda rank, gather: race_all(rank, gather, 2))
    for winners, values, _ in ranks:
        assert winners == single[0] and values.keys() == single[1].keys()
        assert all(torch.equal(values[k], single[1][k]) for k in values)
    assert sum(calls for _, _, calls in ranks) == single[2]  # the work is shared, not repeated
