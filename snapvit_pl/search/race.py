"""Racing sub-networks by embedding drift: each is judged on a few fitness images first, and on more only while it
may still be the best of its race (successive halving with a paired test).

A race's entrants (e.g. the candidate head/MLP splits of one budget) all start on the first ``first_images`` fitness
images. After each round the leader is the entrant with the least mean drift so far; an entrant whose drift exceeds
the leader's by more than :data:`RACE_Z` standard errors (of the per-image differences: the images are shared, so
the comparison is paired; from :data:`MIN_IMAGES` images on) leaves the race; the others go on to twice as many
images. A race ends when one entrant is left or every fitness image has been seen (then the least drift wins, as an
exhaustive comparison decides). A race may be given an indifference zone: then an entrant also leaves once the leader
is, by the same test, at most that fraction of the leader's drift worse than it (a near tie need not be settled); and
a last round: then it ends once its entrants have seen that many images (the least drift on them wins).

Identical sub-networks (the same kept units) are evaluated once, in any race; the images are read in an order in
which every prefix is spread over the whole fitness set; the evaluations of a round are shared across DDP ranks and
gathered, so every rank decides the same.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Optional, Sequence

import torch

from ..models.units import Subnet
from .fitness import EmbeddingFitness
from .population import AllGather, evaluate_shared

#: An entrant leaves its race once its mean drift is this many standard errors (paired by image) above the leader's.
RACE_Z = 3.0
#: No entrant leaves a race on fewer images (the standard error of fewer is too rough).
MIN_IMAGES = 16


def race_order(n: int) -> torch.Tensor:
    """Positions ``0 .. n-1`` in bit-reversed order (0, n/2, n/4, 3n/4, ...): every prefix is spread evenly over the
    fitness images (which may be sorted by class)."""
    bits = max(1, (n - 1).bit_length())
    return torch.tensor(sorted(range(n), key=lambda i: int(format(i, f"0{bits}b")[::-1], 2)))


def subnet_key(subnet: Subnet) -> tuple[bytes, ...]:
    """The kept units of a sub-network as a dictionary key (identical sub-networks: one evaluation)."""
    return tuple(t.to(torch.int64).numpy().tobytes() for t in subnet.heads + subnet.neurons)


@dataclass(eq=False)
class Entrant:
    """One sub-network in a race.

    Attributes:
        subnet: its kept units.
        cost: the relative cost of one image through it (its FLOPs), to share the work across ranks.
        tie: preference on equal drift (lower wins), e.g. the distance of its head ratio to the schedule's.
        label: anything the caller wants back (e.g. its head and MLP ratios).
    """

    subnet: Subnet
    cost: float
    tie: float = 0.0
    label: object = None
    key: tuple[bytes, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.key = subnet_key(self.subnet)


class Race:
    """The entrants of one decision; :attr:`winner` once decided.

    Args:
        entrants: the sub-networks that compete.
        first_images: images of its first round (default: the racer's).
        favourite: an entrant chosen by a cheaper criterion, to confirm: it wins at once if it leads after the first
            round (else the race goes on as any other).
        indifference: a fraction of the leader's drift: an entrant also leaves once the leader is, at :data:`RACE_Z`
            standard errors, at most this much worse than it (0: every race settled as the exhaustive comparison would).
        last_images: the race ends once its entrants have seen this many images, the least drift on them winning
            (default: every fitness image).
    """

    def __init__(self, entrants: Sequence[Entrant], first_images: Optional[int] = None,
                 favourite: Optional[Entrant] = None, indifference: float = 0.0, last_images: Optional[int] = None):
        if indifference < 0:
            raise ValueError(f"indifference must be at least 0 (a fraction of the leader's drift), got {indifference}")
        if last_images is not None and last_images < 1:
            raise ValueError(f"last_images must be at least 1, got {last_images}")
        self.first_images, self.indifference, self.last_images = first_images, float(indifference), last_images
        self.entrants: list[Entrant] = []
        self.alive: list[Entrant] = []
        self.enter(entrants)
        self.favourite = favourite

    def enter(self, entrants: Sequence[Entrant]) -> None:
        """Add entrants (those with the kept units of an entrant already in the race are left out, unless preferred
        on ties: then they replace it); a decided race is reopened."""
        for entrant in entrants:
            same = next((e for e in self.entrants if e.key == entrant.key), None)
            if same is None:
                self.entrants.append(entrant)
                self.alive.append(entrant)
            elif entrant.tie < same.tie:
                self.entrants[self.entrants.index(same)] = entrant
                if same in self.alive:
                    self.alive[self.alive.index(same)] = entrant
        self.images, self.rounds = 0, 0
        self.winner: Optional[Entrant] = None
        self.favourite: Optional[Entrant] = None  # a reopened race confirms nothing


class Racer:
    """Runs races over one fitness (its images, dense embeddings and PCA), remembering every evaluation.

    Args:
        fitness: the run's :class:`EmbeddingFitness`.
        first_images: fitness images of the first round (clipped to the fitness set; all of them: every entrant sees
            every image, an exhaustive comparison).
        z: see :data:`RACE_Z` (its default).
        rank, world_size, all_gather: this process's place in a DDP run (see :func:`evaluate_shared`).
    """

    def __init__(self, fitness: EmbeddingFitness, first_images: int, z: Optional[float] = None, rank: int = 0,
                 world_size: int = 1, all_gather: Optional[AllGather] = None):
        self.fitness, self.z = fitness, RACE_Z if z is None else z
        self.total = int(fitness.images.shape[0])
        self.first = max(1, min(int(first_images), self.total))
        self.order = race_order(self.total)
        self.rank, self.world_size, self.all_gather = rank, world_size, all_gather
        self.values: dict[Hashable, torch.Tensor] = {}  # per-image cosine, in race order, of the images seen so far
        self.image_evaluations = 0  # sub-network x image forwards made (all ranks together)

    def drift(self, entrant: Entrant, images: Optional[int] = None) -> float:
        """``1 - mean cosine`` of ``entrant`` over the first ``images`` images in race order (default: all it saw)."""
        values = self.values[entrant.key][:images]
        return float(1.0 - values.mean())

    def seen(self, entrant: Entrant) -> int:
        """Fitness images ``entrant`` has been evaluated on."""
        return len(self.values.get(entrant.key, ()))

    def run(self, races: Sequence[Race], reopen: Optional[Callable[[Race], Sequence[Entrant]]] = None) -> None:
        """Run ``races`` side by side (each round's evaluations of every race shared across ranks) until each has a
        winner. ``reopen(race)`` is asked for more entrants when a race is decided (none: it stays decided)."""
        while True:
            active = [r for r in races if r.winner is None]
            if not active:
                return
            for race in active:
                race.images = race.images or max(1, min(race.first_images or self.first, self._last(race)))
            self._evaluate(active)
            for race in active:
                self._step(race)
                if race.winner is not None and reopen is not None:
                    more = [e for e in reopen(race) if e.key not in {x.key for x in race.entrants}]
                    if more:
                        race.alive = [race.winner]
                        race.enter(more)

    def _last(self, race: Race) -> int:
        """Images of ``race``'s last round."""
        return min(race.last_images or self.total, self.total)

    def _evaluate(self, races: Sequence[Race]) -> None:
        wanted: dict[Hashable, tuple[Entrant, int]] = {}
        for race in races:
            for entrant in race.alive:
                have = wanted.get(entrant.key, (entrant, 0))[1]
                wanted[entrant.key] = (entrant, max(have, race.images))
        jobs = [(entrant, self.seen(entrant), images) for entrant, images in wanted.values() if self.seen(entrant) < images]
        results = evaluate_shared(
            jobs, lambda job: self.fitness.similarities(job[0].subnet, self.order[job[1]:job[2]]),
            [stop - start for _, start, stop in jobs], [(stop - start) * e.cost for e, start, stop in jobs],
            self.rank, self.world_size, self.all_gather)
        for (entrant, start, stop), values in zip(jobs, results):
            self.values[entrant.key] = torch.cat([self.values.get(entrant.key, values[:0]), values])
            self.image_evaluations += stop - start

    def _step(self, race: Race) -> None:
        """Drop the entrants clearly behind the leader; decide the race, or double its images."""
        n = race.images
        values = {e.key: self.values[e.key][:n] for e in race.alive}
        drift = {e.key: 1.0 - float(values[e.key].mean()) for e in race.alive}
        leader = min(race.alive, key=lambda e: (drift[e.key], e.tie))
        if n >= MIN_IMAGES:
            behind = []
            zone = race.indifference * drift[leader.key]  # the leader may be this much worse and still win
            for entrant in race.alive:
                difference = values[leader.key] - values[entrant.key]  # > 0: the entrant drifts more
                error = float(difference.std()) / n ** 0.5
                if entrant is not leader and float(difference.mean()) + zone > self.z * error:
                    behind.append(entrant)
            race.alive = [e for e in race.alive if e not in behind]
        race.rounds += 1
        last = self._last(race)
        if len(race.alive) == 1 or n >= last or (race.rounds == 1 and race.favourite is not None
                                                             and leader.key == race.favourite.key):
            race.winner = leader
        else:
            race.images = min(2 * n, last)
