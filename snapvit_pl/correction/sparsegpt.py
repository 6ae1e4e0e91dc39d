"""SparseGPT-style weight correction for structurally removed input columns.

Structured pruning removes *input* columns of a linear layer (``attn.proj`` loses the
columns of removed heads, ``mlp.fc2`` those of removed hidden neurons). Given the layer's
calibration inputs X, the Optimal Brain Surgeon update moves the removed columns' error
onto the kept ones so that ``X_keep @ W_keep^T`` stays close to ``X @ W^T``. This is the
``fasterprune`` loop of IST-DASLab's sparsegpt with a fixed set of removed columns instead
of a magnitude mask. :func:`correct_and_prune` drives it over a whole model, block by block.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
from torch import nn

from ..models.surgery import prune_
from ..models.tokens import block_kwargs
from ..models.units import Subnet, prunable_blocks
from ..progress import Progress, ProgressMode
from ..ranges import one_of
from .calibration import BATCH_SIZE, STAGES, block_inputs, blocks_losing_units, run_block

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


# -- the driver: structured pruning with the SparseGPT-style update, block by block ---------------------------------
# For each block in order, the calibration hidden states entering it come from the blocks before it *after* they were
# corrected and pruned, so every correction sees the inputs the final model sees: (1) run the dense-width block,
# collect the inputs of attn.proj, correct proj to the kept heads' columns, prune the heads and write the corrected
# weight; (2) re-run the block (pruned attention), collect the inputs of mlp.fc2, correct it to the kept neurons'
# columns, prune the neurons, write the weight; (3) run the corrected block once more: its outputs are the next
# block's calibration inputs.


@torch.no_grad()
def correct_and_prune(
    model: nn.Module,
    subnet: Subnet,
    images: torch.Tensor,
    batch_size: int = BATCH_SIZE,
    damping: Damping = DAMPING,
    damp_fraction: float = DAMP_FRACTION,
    block_size: int = BLOCK_SIZE,
    progress: ProgressMode | bool = False,
) -> nn.Module:
    """Prune ``model`` to ``subnet`` in place, correcting ``attn.proj``/``mlp.fc2`` on calibration images.

    Blocks that lose no unit are left bitwise unchanged; so is everything outside the blocks.

    Args:
        model: a dense supported timm ViT (pass a copy to keep the original).
        subnet: kept heads / neurons per block.
        images: calibration images ``[N, C, H, W]`` (moved to the model's device batch by batch).
        batch_size: images per forward pass.
        damping, damp_fraction, block_size: passed to :meth:`ColumnCorrector.correct` (``correction.damping``,
            ``correction.damp_fraction``, ``correction.block_size``).
        progress: show progress over blocks (a :class:`snapvit_pl.progress.Progress` mode).

    Returns:
        ``model``, with the architecture of ``prune_(model, subnet)``.
    """
    subnet, dense, todo = blocks_losing_units(model, subnet)
    if not todo:
        return model
    was_training = model.training
    model.eval()
    cache, rope = block_inputs(model, images, batch_size)
    options = dict(block_size=block_size, damping=damping, damp_fraction=damp_fraction)
    with Progress("correction", todo[-1] + 1, progress, unit="block") as bar:
        for b in range(todo[-1] + 1):
            kwargs = block_kwargs(model, rope, b)
            for group_name, layer_name in STAGES:
                keep = getattr(subnet, group_name)[b]
                if len(keep) < len(getattr(dense, group_name)[b]):
                    _correct_group(model, b, group_name, layer_name, keep, cache, kwargs, batch_size, options)
            if b < todo[-1]:
                run_block(model.blocks[b], cache, kwargs, batch_size, write=True)
            bar.update()
    model.train(was_training)
    return model


def _correct_group(
    model: nn.Module, b: int, group_name: str, layer_name: str, keep: torch.Tensor,
    cache: torch.Tensor, kwargs: dict, batch_size: int, options: dict,
) -> None:
    """Collects the layer's inputs on ``cache``, corrects it to the kept units' columns, prunes block ``b``'s group."""
    group = getattr(prunable_blocks(model)[b], group_name)
    layer = getattr(group.module, layer_name)
    slot = next(s for s in group.slots if s.path == f"{layer_name}.weight")
    corrector = ColumnCorrector(layer, name=f"blocks.{b}.{layer_name}")
    handle = corrector.attach()
    try:
        run_block(model.blocks[b], cache, kwargs, batch_size, write=False)
    finally:
        handle.remove()
    # prune_ slices the columns in the same order as group.index (keep is sorted by validate).
    weight = corrector.correct(group.index(keep, slot), **options)
    del corrector  # frees the Hessian before the next layer's is allocated
    selection = Subnet.full(model)
    getattr(selection, group_name)[b] = keep
    prune_(model, selection)
    layer.weight.copy_(weight)
