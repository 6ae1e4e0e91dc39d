import pytest
import torch
from torch import nn

from snapvit_pl.correction import ColumnCorrector

IN, OUT = 64, 32


def correlated_inputs(n, seed, d=IN):
    """X = Z @ M with a well-conditioned random mixing (singular values in [0.3, 3])."""
    g = torch.Generator().manual_seed(0)  # same distribution for every seed
    q1, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    q2, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    mix = q1 @ torch.diag(torch.logspace(-0.5, 0.5, d)) @ q2 + 0.3 * torch.ones(d, d) / d**0.5
    z = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    return z @ mix


def make(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    layer = nn.Linear(IN, OUT).to(dtype)
    return layer, ColumnCorrector(layer, name="blocks.0.mlp.fc2")


def random_keep(frac=0.5, seed=0):
    perm = torch.randperm(IN, generator=torch.Generator().manual_seed(seed))
    return perm[: int(IN * frac)].sort().values


def sq_err(x, keep, w_keep, w):
    return ((x[:, keep] @ w_keep.T - x @ w.T) ** 2).sum().item()


def test_no_removed_columns_is_noop():
    layer, c = make()
    for s in range(3):
        c.add_batch(correlated_inputs(256, s).reshape(4, 64, IN))
    out = c.correct(torch.arange(IN))
    assert out.shape == layer.weight.shape
    torch.testing.assert_close(out, layer.weight.detach(), atol=1e-6, rtol=0)


def test_running_average_matches_direct_hessian():
    _, c = make()
    x = correlated_inputs(1000, 1)
    for chunk in x.split(137):
        c.add_batch(chunk)
    torch.testing.assert_close(c.H, 2 * x.T @ x / len(x), rtol=1e-4, atol=1e-4)
    assert c.nsamples == 1000


# Natural order leaves kept columns left of a removed one uncompensated: ~0.45x vs ~0.8x here.
@pytest.mark.parametrize("removed_first,bound", [(True, 0.6), (False, 0.9)])
def test_correction_reduces_heldout_error(removed_first, bound):
    layer, c = make()
    c.add_batch(correlated_inputs(4096, 1))
    keep = random_keep()
    w = layer.weight.detach()
    w_corr = c.correct(keep, block_size=16, removed_first=removed_first)
    x_test = correlated_inputs(4096, 2)
    naive, corrected = sq_err(x_test, keep, w[:, keep], w), sq_err(x_test, keep, w_corr, w)
    assert corrected < bound * naive, (corrected, naive)


def test_removed_first_is_at_least_as_good():
    layer, c = make()
    x = correlated_inputs(4096, 1)
    c.add_batch(x)
    keep, w = random_keep(), layer.weight.detach()
    first = sq_err(x, keep, c.correct(keep, removed_first=True), w)
    natural = sq_err(x, keep, c.correct(keep, removed_first=False), w)
    assert first <= natural * (1 + 1e-5)


def test_matches_least_squares_optimum():
    layer, c = make()
    x = correlated_inputs(4096, 1)
    c.add_batch(x)
    keep, w = random_keep(), layer.weight.detach()
    w_corr = c.correct(keep, block_size=IN, damp_fraction=1e-7, removed_first=True)
    x64 = x.double()
    w_ls = torch.linalg.lstsq(x64[:, keep], x64 @ w.double().T).solution.T.float()
    assert ((w_corr - w_ls).norm() / w_ls.norm()).item() < 1e-3


def test_blocking_is_exact():
    layer, c = make()
    c.add_batch(correlated_inputs(2048, 1))
    keep = random_keep(0.4, seed=3)
    for removed_first in (True, False):
        ref = c.correct(keep, block_size=IN, removed_first=removed_first)
        for bs in (1, 7, 16):
            torch.testing.assert_close(c.correct(keep, block_size=bs, removed_first=removed_first), ref,
                                       rtol=1e-4, atol=1e-5)


def test_keep_order_is_respected():
    layer, c = make()
    c.add_batch(correlated_inputs(1024, 1))
    keep = random_keep()
    shuffled = keep[torch.randperm(len(keep))]
    torch.testing.assert_close(c.correct(shuffled), c.correct(keep)[:, torch.argsort(torch.argsort(shuffled))])


@pytest.mark.parametrize("damping,frac", [("mean", 0.01), ("max", 0.1), ("p95", 0.01)])
@pytest.mark.parametrize("removed_first", [True, False])
def test_damping_strategies_finite_with_dead_input(damping, frac, removed_first):
    layer, c = make()
    x = correlated_inputs(2048, 1)
    x[:, 3] = 0.0  # dead, removed
    x[:, 5] = 0.0  # dead, kept
    c.add_batch(x)
    keep = torch.tensor([k for k in range(IN) if k % 2 == 1])  # keeps 5, removes 3
    w_corr = c.correct(keep, damping=damping, damp_fraction=frac, removed_first=removed_first)
    assert w_corr.shape == (OUT, len(keep)) and torch.isfinite(w_corr).all()
    # A dead kept column is decoupled: it neither receives error nor gets zeroed.
    torch.testing.assert_close(w_corr[:, 2], layer.weight.detach()[:, 5])
    w = layer.weight.detach()
    assert sq_err(x, keep, w_corr, w) < sq_err(x, keep, w[:, keep], w)


def test_bf16_layer():
    layer, c = make(dtype=torch.bfloat16)
    c.add_batch(correlated_inputs(1024, 1).to(torch.bfloat16))
    assert c.H.dtype == torch.float32
    w_corr = c.correct(random_keep())
    assert w_corr.dtype == torch.bfloat16 and torch.isfinite(w_corr).all()


def test_not_positive_definite_retries_then_raises():
    layer = nn.Linear(2, 3)
    c = ColumnCorrector(layer, name="blocks.7.attn.proj")
    c.add_batch(torch.randn(4, 2))
    c.H = torch.tensor([[1.0, 2.0], [2.0, 1.0]])  # indefinite; fixed by damp 1.0 (2nd retry)
    with pytest.warns(UserWarning, match="retrying"):
        assert torch.isfinite(c.correct([1])).all()
    c.H = torch.tensor([[1.0, 100.0], [100.0, 1.0]])  # needs damp > 99
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match=r"blocks\.7\.attn\.proj.*damp_fraction"):
        c.correct([1])


def test_invalid_inputs():
    layer, c = make()
    with pytest.raises(RuntimeError, match="no calibration"):
        c.correct([0])
    c.add_batch(torch.randn(8, IN))
    with pytest.raises(ValueError):
        c.correct([0, 0])
    with pytest.raises(ValueError):
        c.correct([IN])
    with pytest.raises(ValueError, match="damping"):
        c.correct([0], damping="median")
    with pytest.raises(TypeError):
        ColumnCorrector(nn.Conv2d(1, 1, 1))


def test_attach_hook_collects_inputs():
    layer, c = make()
    handle = c.attach()
    x = torch.randn(2, 10, IN)
    layer(x)
    handle.remove()
    layer(x)
    assert c.nsamples == 20
    torch.testing.assert_close(c.H, 2 * x.reshape(-1, IN).T @ x.reshape(-1, IN) / 20, rtol=1e-4, atol=1e-5)
