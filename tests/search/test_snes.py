import math

import pytest
import torch

from snapvit_pl.search import SNES, XNES
from ask_tell import minimize

D = 10


def sphere(x):
    return float((x**2).sum())


def ellipsoid(condition):
    weights = condition ** (torch.arange(D, dtype=torch.float64) / (D - 1))
    return lambda x: float((weights * x**2).sum())


@pytest.mark.parametrize("fn", [sphere, ellipsoid(1e2)], ids=["sphere", "ellipsoid"])
def test_converges_in_a_few_dozen_generations_where_xnes_does_not(fn):
    start = torch.ones(D, dtype=torch.float64)
    snes, xnes = SNES(start, sigma=1.0, seed=0), XNES(start, sigma=1.0, seed=0)
    _, best = minimize(snes, fn, 50 * snes.popsize)  # 50 generations
    _, paper = minimize(xnes, fn, 50 * xnes.popsize)
    assert best < 1e-2 * fn(start) and snes.generation == 50
    assert paper > 10 * best


def test_step_size_adapts_where_xnes_default_does_not():
    """42 coefficients (the reference model): in 60 generations SNES halves its steps; the paper's xNES rates
    leave sigma near 1."""
    start = torch.full((42,), 1.0, dtype=torch.float64)
    snes, xnes = SNES(start, popsize=8, seed=0), XNES(start, popsize=8, seed=0)
    minimize(snes, sphere, 480)
    minimize(xnes, sphere, 480)
    assert snes.sigma < 0.6
    assert xnes.sigma > 0.9


def test_resume_is_exact_and_refuses_another_strategy():
    start = torch.ones(5, dtype=torch.float64)
    reference = SNES(start, sigma=0.5, popsize=4, seed=3)
    minimize(reference, sphere, 40)
    first = SNES(start, sigma=0.5, popsize=4, seed=3)
    minimize(first, sphere, 16)
    resumed = SNES(start, sigma=0.5, popsize=4, seed=99)
    resumed.load_state_dict(first.state_dict())
    minimize(resumed, sphere, 40)
    assert torch.equal(resumed.mean, reference.mean) and torch.equal(resumed.sigmas, reference.sigmas)
    assert resumed.best_fitness == reference.best_fitness
    with pytest.raises(ValueError, match="SNES state cannot resume a XNES"):
        XNES(start).load_state_dict(first.state_dict())


def test_nonfinite_fitness_never_wins():
    opt = SNES(torch.ones(3, dtype=torch.float64), popsize=6, seed=0)
    minimize(opt, lambda x: math.nan if float(x[0]) > 1 else sphere(x), 60)
    assert math.isfinite(opt.best_fitness) and opt.nonfinite_evaluations > 0
