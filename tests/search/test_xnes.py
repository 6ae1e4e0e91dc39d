import math

import pytest
import torch

from snapvit_pl.search.xnes import XNES, default_popsize, xnes_utilities
from ask_tell import minimize

D = 10


def sphere(x):
    return float((x**2).sum())


def rotated_ellipsoid(condition):
    rotation, _ = torch.linalg.qr(torch.randn(D, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    weights = condition ** (torch.arange(D, dtype=torch.float64) / (D - 1))
    return lambda x: float((weights * (rotation @ x) ** 2).sum())


def test_default_popsize():
    assert default_popsize(156) == 19
    assert default_popsize(10) == 10
    assert XNES(torch.ones(156)).popsize == 19


def test_utilities_sum_to_zero_and_decrease():
    u = xnes_utilities(19)
    assert abs(float(u.sum())) < 1e-12
    assert torch.all(u[:-1] >= u[1:])


def test_converges_on_sphere():
    opt = XNES(torch.full((D,), 3.0), sigma=1.0, seed=0)
    best_x, best_f = minimize(opt, sphere, 10_000)
    assert best_f < 1e-8
    assert best_x.abs().max() < 1e-3
    assert opt.evaluations == 10_000


@pytest.mark.parametrize("condition", [1e3, 1e4])
def test_converges_on_rotated_ellipsoid(condition):
    opt = XNES(torch.full((D,), 3.0), sigma=1.0, seed=0)
    _, best_f = minimize(opt, rotated_ellipsoid(condition), 12_000)
    assert best_f < 1e-8
    # the learned shape should be elongated along the cheap directions
    singular_values = torch.linalg.svdvals(opt.A)
    assert singular_values.max() / singular_values.min() > 10


def test_initial_covariance_sets_factor():
    covariance = torch.tensor([[4.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    opt = XNES(torch.zeros(2), sigma=0.5, covariance=covariance)
    torch.testing.assert_close(opt.A @ opt.A.T, 0.25 * covariance)
    samples = torch.cat([opt.ask() for _ in range(4000)])
    torch.testing.assert_close(samples.T.cov(), 0.25 * covariance, atol=0.03, rtol=0.05)


def test_seeded_reproducibility():
    runs = [XNES(torch.ones(D), seed=seed) for seed in (7, 7, 8)]
    results = [minimize(run, sphere, 200) for run in runs]
    assert torch.equal(results[0][0], results[1][0]) and results[0][1] == results[1][1]
    assert not torch.equal(results[0][0], results[2][0])
    assert runs[0].history == runs[1].history


def test_resume_is_bit_identical():
    reference = XNES(torch.ones(D), seed=3)
    minimize(reference, sphere, 305)  # ends with a truncated generation

    first = XNES(torch.ones(D), seed=3)
    minimize(first, sphere, 100)
    state = first.state_dict()
    resumed = XNES(torch.zeros(D), sigma=5.0, seed=99)  # settings are overwritten by the state
    resumed.load_state_dict(state)
    minimize(resumed, sphere, 305)

    resumed_state = resumed.state_dict()
    for key, value in reference.state_dict().items():
        other = resumed_state[key]
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, other), key
        else:
            assert value == other, key
    assert torch.equal(reference.ask(), resumed.ask())


def test_state_dict_is_detached_from_optimizer():
    opt = XNES(torch.ones(D), seed=0)
    state = opt.state_dict()
    minimize(opt, sphere, 50)
    assert torch.equal(state["mean"], torch.ones(D, dtype=torch.float64))
    assert state["evaluations"] == 0


def test_nonfinite_fitness_ranks_worst_and_is_counted():
    opt = XNES(torch.ones(D), seed=0)
    bad = {"count": 0}

    def flaky(x):
        if float(x[0]) > 1.0:  # about half the candidates early on
            bad["count"] += 1
            return math.nan if bad["count"] % 2 else math.inf
        return sphere(x)

    best_x, best_f = minimize(opt, flaky, 3000)
    assert opt.nonfinite_evaluations == bad["count"] > 0
    assert math.isfinite(best_f) and best_f < 1e-3
    assert float(best_x[0]) <= 1.0
    assert all(math.isfinite(entry["best_fitness"]) for entry in opt.history)


def test_all_nonfinite_generation_leaves_best_unset():
    opt = XNES(torch.ones(D), seed=0)
    samples = opt.ask()
    opt.tell(samples, torch.full((opt.popsize,), math.nan))
    assert opt.best_x is None and opt.best_fitness == math.inf
    assert opt.nonfinite_evaluations == opt.popsize
    assert torch.isfinite(opt.mean).all() and math.isfinite(opt.sigma)


def test_callback_can_stop_early():
    opt = XNES(torch.ones(D), seed=0)
    minimize(opt, sphere, 1000, lambda o: o.generation == 3)
    assert opt.generation == 3 and opt.evaluations == 3 * opt.popsize
    assert [entry["generation"] for entry in opt.history] == [1, 2, 3]
