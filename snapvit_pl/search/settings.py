"""The search's settings and its optimiser registry: the one home of every search default."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch

from ..errors import ConfigError
from ..ranges import AtLeastTwo, NonNegativeInt, PositiveFloat, PositiveInt, Seed, check_fields, one_of
from ..seeding import resolve_seed
from .base import EvolutionStrategy
from .snes import SNES
from .xnes import XNES

#: The optimisers ``search.optimizer`` names.
OPTIMIZERS: dict[str, type[EvolutionStrategy]] = {"snes": SNES, "xnes": XNES}
Optimizer = one_of(*OPTIMIZERS)
#: How the search parametrises the coefficients (``search.parametrization``).
Parametrization = one_of("log", "linear")

#: (mlp_ratio, head_ratio) pairs the fitness averages over (the paper's).
DEFAULT_SPARSITY_PAIRS: tuple[tuple[float, float], ...] = ((0.15, 0.0), (0.35, 0.2), (0.55, 0.4), (0.65, 0.5))


#: The paper's initial coefficients, from the first block to the last.
SNAPVIT_INITIAL_RANGE: tuple[float, float] = (1.2, 0.8)


@dataclass
class SearchSettings:
    """How the coefficients are searched, and the fitness every candidate (and every split) is judged by.

    By default nothing is searched (``max_evaluations: 0``, every coefficient 1): the default score,
    :class:`snapvit_pl.scoring.GaussNewtonGreedy`, is a removal order under the drift model of all units of
    all blocks together, which computes the interactions a coefficient search looks for (docs/method.md, "The
    default score");
    the fitness still chooses each budget's head/MLP split. For scores that are not calibrated across
    blocks (SnapViT's SSL-Fisher), ``SearchSettings.paper()`` is SnapViT's own search (xNES on the
    coefficients themselves, step 1, the default population, 50 evaluations, coefficients from 1.2 to 0.8:
    ``configs/prune/snapvit.yaml``), and ``SearchSettings.snes()`` this project's alternative (a separable
    NES on the log coefficients, step 0.5, 8 candidates per generation, 150 evaluations).

    Args:
        optimizer: ``snes`` (separable NES) or ``xnes`` (the paper's full-covariance xNES).
        max_evaluations: fitness evaluations (candidates); 0 (default) keeps the initial coefficients.
        max_time: wall-clock limit of the search in seconds (None: none); the search stops before
            a generation it predicts would end past the limit.
        popsize: candidates per generation (None: ``4 + floor(3 ln D)``, the NES papers' choice; 8 gives a
            short search more generations).
        sigma: initial step size (on the log coefficients with ``parametrization: log``).
        parametrization: ``log`` searches log |coefficient| (multiplicative steps), ``linear`` the
            coefficient itself (the paper; the unit score uses its absolute value).
        seed: seed of the search (identical on every DDP rank); None: ``prune.py``'s ``seed_everything`` (0 from
            Python).
        num_images: images of the fitness set (plain views of the pruning data); also judge the splits.
        batch_size: forward batch size of the fitness.
        pca_components: PCA dimension of the embeddings (at most ``num_images``).
        sparsity_pairs: (mlp_ratio, head_ratio) pairs averaged by the fitness.
        initial_range: the initial coefficients go linearly from the first to the last block (default all 1).
    """

    optimizer: Optimizer = "snes"
    max_evaluations: NonNegativeInt = 0
    max_time: Optional[PositiveFloat] = None
    popsize: Optional[AtLeastTwo] = 8
    sigma: PositiveFloat = 0.5
    parametrization: Parametrization = "log"
    seed: Optional[Seed] = None
    num_images: PositiveInt = 1000
    batch_size: PositiveInt = 64
    pca_components: PositiveInt = 192
    sparsity_pairs: list[tuple[float, float]] = field(default_factory=lambda: [tuple(p) for p in DEFAULT_SPARSITY_PAIRS])
    initial_range: tuple[float, float] = (1.0, 1.0)

    def __post_init__(self) -> None:
        self.seed = resolve_seed(self.seed)
        check_fields(self, "search")
        problems = []
        if self.pca_components > self.num_images >= 1:
            problems.append(f"pca_components {self.pca_components} exceeds num_images {self.num_images} (a PCA of N "
                            f"images has at most N components); lower pca_components or raise num_images")
        if not self.sparsity_pairs:
            problems.append("sparsity_pairs must hold at least one (mlp_ratio, head_ratio) pair")
        if self.parametrization == "log" and min(self.initial_range) <= 0:
            problems.append(f"initial_range must be positive with parametrization log, got {list(self.initial_range)}")
        if problems:
            raise ConfigError("search: " + "; ".join(problems))
        self.sparsity_pairs = [tuple(float(v) for v in pair) for pair in self.sparsity_pairs]
        self.initial_range = tuple(float(v) for v in self.initial_range)

    @classmethod
    def paper(cls, **overrides: Any) -> "SearchSettings":
        """SnapViT's own search (the paper's; ``configs/prune/snapvit.yaml``): xNES on the coefficients themselves,
        sigma 1, the default population ``4 + floor(3 ln D)``, 50 evaluations, coefficients from 1.2 to 0.8."""
        return cls(**{"optimizer": "xnes", "sigma": 1.0, "parametrization": "linear", "popsize": None,
                      "max_evaluations": 50, "initial_range": SNAPVIT_INITIAL_RANGE, **overrides})

    @classmethod
    def snes(cls, **overrides: Any) -> "SearchSettings":
        """This project's alternative search for SnapViT's SSL-Fisher scores (not the paper's): SNES on the log
        coefficients, step 0.5, 8 candidates per generation, 150 evaluations, coefficients starting from the paper's
        1.2 (first block) to 0.8 (last block)."""
        return cls(**{"max_evaluations": 150, "initial_range": SNAPVIT_INITIAL_RANGE, **overrides})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings (the record in the report and the elastic artifact)."""
        return {k: list(map(list, v)) if k == "sparsity_pairs" else (list(v) if isinstance(v, tuple) else v)
                for k, v in asdict(self).items()}

    def strategy(self, coefficients: torch.Tensor) -> EvolutionStrategy:
        """The optimiser, started at ``coefficients`` (in the search's parametrization)."""
        return OPTIMIZERS[self.optimizer](self.to_search_space(coefficients), sigma=self.sigma, popsize=self.popsize,
                                          seed=self.seed)

    def to_search_space(self, coefficients: torch.Tensor) -> torch.Tensor:
        return coefficients.double().abs().log() if self.parametrization == "log" else coefficients.double()

    def to_coefficients(self, x: torch.Tensor) -> torch.Tensor:
        """A point of the search space as coefficients (float32)."""
        return (x.exp() if self.parametrization == "log" else x).float()
