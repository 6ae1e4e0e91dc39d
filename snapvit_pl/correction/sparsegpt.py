"""SparseGPT-style weight correction for structurally removed input columns.

Structured pruning removes *input* columns of a linear layer (``attn.proj`` loses the
columns of removed heads, ``mlp.fc2`` those of removed hidden neurons). Given the layer's
calibration inputs X, the Optimal Brain Surgeon update moves the removed columns' error
onto the kept ones so that ``X_keep @ W_keep^T`` stays close to ``X @ W^T``. This is the
``fasterprune`` loop of IST-DASLab's sparsegpt with a fixed set of removed columns instead
of a magnitude mask.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
from torch import nn

from ..ranges import one_of

Damping = one_of("mean", "max", "p95")
#: The correction's defaults (sparsegpt's): columns per block of the OBS loop, and the damping added to diag(H).
BLOCK_SIZE = 128
DAMPING: Damping = "mean"
DAMP_FRACTION = 0.01


class ColumnCorrector:
    """Accumulates the input Hessian of one ``nn.Linear`` and corrects it for removed columns.

    Usage: ``attach()`` (or call ``add_batch`` yourself) while running calibration data,
    then ``correct(keep_columns)`` returns the new ``[out_features, len(keep)]`` weight.
    The bias is left unchanged: the update only redistributes error through the kept
    columns (H has no constant input), so the bias is not a free variable of the problem.
    """

    def __init__(self, layer: nn.Linear, name: str | None = None) -> None:
        if not isinstance(layer, nn.Linear):
            raise TypeError(f"ColumnCorrector expects nn.Linear, got {type(layer).__name__}")
        self.layer = layer
        self.name = name or layer.__class__.__name__
        self.columns = layer.in_features
        self.H = torch.zeros(self.columns, self.columns, device=layer.weight.device, dtype=torch.float32)
        self.nsamples = 0

    @torch.no_grad()
    def add_batch(self, inputs: torch.Tensor) -> None:
        """Adds inputs ``[..., in_features]`` (every leading position is a token) to H = (2/n) sum x x^T."""
        x = inputs.detach().reshape(-1, self.columns).to(self.H.device, torch.float32)
        m = x.shape[0]
        if m == 0:
            return
        total = self.nsamples + m
        # Running average: rescale the old mean, and scale x before the product so that
        # no sum of n outer products is ever formed (stable in fp32 for many tokens).
        self.H.mul_(self.nsamples / total)
        x = x * math.sqrt(2.0 / total)
        self.H.addmm_(x.t(), x)
        self.nsamples = total

    def attach(self) -> torch.utils.hooks.RemovableHandle:
        """Registers a forward hook feeding the layer's inputs to ``add_batch``; remove the handle when done."""
        return self.layer.register_forward_hook(lambda _m, inp, _out: self.add_batch(inp[0]))

    @torch.no_grad()
    def correct(
        self,
        keep_columns: torch.Tensor | Sequence[int],
        block_size: int = BLOCK_SIZE,
        damping: Damping = DAMPING,
        damp_fraction: float = DAMP_FRACTION,
        removed_first: bool = True,
        max_retries: int = 3,
    ) -> torch.Tensor:
        """Returns the corrected weight restricted to ``keep_columns`` (in the given order), in the layer's dtype.

        ``damping`` picks the statistic of diag(H) that ``damp_fraction`` scales (mean: 1% default;
        max: DINOv3 uses 10%; p95: 95th percentile). With ``removed_first`` the removed columns are
        processed first, so every kept column lies to their right and can absorb error; the result is
        then the least-squares optimum of the kept columns. Without it (sparsegpt's natural order) kept
        columns left of a removed column are frozen before it is removed and receive no compensation.
        """
        if self.nsamples == 0:
            raise RuntimeError(f"{self.name}: no calibration inputs were added before correct()")
        weight = self.layer.weight
        cols = self.columns
        keep = torch.as_tensor(keep_columns, dtype=torch.long, device=weight.device).flatten()
        if keep.numel() and (keep.min() < 0 or keep.max() >= cols or keep.unique().numel() != keep.numel()):
            raise ValueError(f"{self.name}: keep_columns must be unique indices in [0, {cols})")
        removed = torch.ones(cols, dtype=torch.bool, device=weight.device)
        removed[keep] = False

        W = weight.detach().to(torch.float32).clone()
        if not removed.any():
            return W[:, keep].to(weight.dtype)
        H = self.H.clone()
        # Dead inputs (never active on calibration data): decouple them as sparsegpt does. Their
        # row/column of H^-1 is then zero off the diagonal, so they neither send nor receive error;
        # a removed dead column is dropped as usual, a kept one is left untouched (sparsegpt zeros
        # it, which would only change the layer off the calibration data).
        dead = torch.diag(H) == 0
        H[dead, dead] = 1.0

        perm = None
        if removed_first:
            perm = torch.cat([removed.nonzero().flatten(), (~removed).nonzero().flatten()])
            W, H, removed = W[:, perm], H[perm][:, perm], removed[perm]

        Hinv = self._inverse_cholesky(H, damping, damp_fraction, max_retries)

        for i1 in range(0, cols, block_size):
            i2 = min(i1 + block_size, cols)
            rows = removed[i1:i2].nonzero().flatten().tolist()
            if not rows:  # only kept columns: no error originates here
                continue
            W1, Hinv1 = W[:, i1:i2], Hinv[i1:i2, i1:i2]
            Err1 = torch.zeros_like(W1)
            for i in rows:
                # OBS: removing w_i costs err = w_i / [H^-1]_ii; the row of the upper Cholesky
                # factor of H^-1 is the optimal update of the not-yet-processed columns.
                err = W1[:, i] / Hinv1[i, i]
                W1[:, i:].sub_(err.unsqueeze(1) * Hinv1[i, i:].unsqueeze(0))
                W1[:, i] = 0.0
                Err1[:, i] = err
            # Lazy batch update: the block's accumulated error onto all columns to its right.
            W[:, i2:].sub_(Err1 @ Hinv[i1:i2, i2:])

        if perm is not None:
            W = W[:, torch.argsort(perm)]
        return W[:, keep].to(weight.dtype)

    def _inverse_cholesky(self, H: torch.Tensor, damping: Damping, frac: float, retries: int) -> torch.Tensor:
        """Upper Cholesky factor of (H + damp I)^-1, retrying with 10x damping when not positive definite."""
        diag = torch.diag(H)
        stats = {"mean": diag.mean, "max": diag.max, "p95": lambda: torch.quantile(diag, 0.95)}
        if damping not in stats:
            raise ValueError(f"damping must be one of {sorted(stats)}, got {damping!r}")
        damp = frac * float(stats[damping]())
        eye = torch.eye(H.shape[0], device=H.device, dtype=H.dtype)
        for attempt in range(retries + 1):
            L, info = torch.linalg.cholesky_ex(H + damp * eye)
            if info == 0:
                U, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(L), upper=True)
                if info == 0 and torch.isfinite(U).all():
                    return U
            if attempt < retries:
                warnings.warn(f"{self.name}: Hessian not positive definite with damp={damp:.3g}, retrying x10")
                damp *= 10.0
        raise RuntimeError(
            f"{self.name}: Cholesky of the damped input Hessian failed after {retries} retries "
            f"(last damp={damp:.3g}); use a larger damp_fraction (now {frac}) or damping='max'"
        )
