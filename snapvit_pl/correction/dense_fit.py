"""Correction that rebuilds what the dense model computes, block by block (``correction.method: dense_fit``).

The SparseGPT-style update (:func:`snapvit_pl.correction.correct_and_prune`) fits each pruned layer to its *own*
output on the pruned model's inputs: it repairs that layer, but not the drift that reached the block from every
pruned block before it. This correction fits each pruned block's output projections to the *dense* model's output
of that block, residual stream included (Kwon et al. 2022, "A Fast Post-Training Pruning Framework for
Transformers"; the closed-form ridge compensation of CORP, 2026).

Blocks are processed in order and two streams of calibration hidden states are kept: the dense model's and the
pruned model's (inputs from the blocks already pruned and corrected). For a pre-norm block
``x1 = x + g1 * attn(norm1(x))``, ``y = x1 + g2 * mlp(norm2(x1))`` (``g``: layer scale, or 1), with ``x`` the pruned
stream and ``x_d`` the dense one, the output projections are refitted in two least-squares problems:

1. ``attn.proj`` on its inputs ``a`` (pruned attention, pruned stream) to ``proj_d + (x_d - x) / g1``, so that the
   pruned block's intermediate ``x1`` matches the dense block's ``x1_d``;
2. ``mlp.fc2`` on its inputs ``h`` (pruned MLP on the corrected ``x1``) to ``fc2_d + (x1_d - x1) / g2``, so that the
   block's output matches the dense block's output ``y_d``.

Each problem is the exact ridge solution over every calibration token, with the bias as a free variable (when the
layer has one), regularised toward the weights as cut: ``(AᵀA + λI) W = AᵀT + λ W_cut``, ``λ`` a fraction of
``diag(AᵀA)`` (``damping`` / ``damp_fraction``, as for the SparseGPT update). ``AᵀA`` and ``AᵀT`` are summed batch by
batch in float64 (:class:`RidgeFit`): memory ``O(width²)`` whatever the number of calibration images, and two
processes holding halves of the images give one process's weights when their sums are all-reduced (``reduce``).
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable, Optional

import torch
from timm.models.eva import EvaBlock
from timm.models.vision_transformer import Block, LayerScale
from torch import nn

from ..errors import UnsupportedModelError
from ..models.surgery import prune_
from ..models.tokens import block_kwargs
from ..models.units import Subnet
from ..progress import Progress, ProgressMode
from ..ranges import check_value
from .sparsegpt import DAMP_FRACTION, DAMPING, Damping
from .calibration import BATCH_SIZE, block_inputs, blocks_losing_units
from .reconstruction import Reconstruction, block_error, tail_aside
from .settings import Refit

#: Sums a statistic over the processes that share the calibration images (in place), e.g. ``dist.all_reduce``.
Reduce = Callable[[torch.Tensor], None]


class RidgeFit:
    """Accumulates the normal equations of one ``nn.Linear`` refitted to targets, and solves them.

    ``add(inputs, targets)`` sums ``[A 1]ᵀ[A 1]`` and ``[A 1]ᵀT`` over every token (float64; the constant column only
    when the layer has a bias); ``solve()`` returns the new weight and bias, the ridge pulling toward the layer's
    current weights where the inputs do not determine them (dead or collinear inputs, too few tokens).
    """

    def __init__(self, layer: nn.Linear):
        self.layer = layer
        columns = layer.in_features + (layer.bias is not None)
        device = layer.weight.device
        self.gram = torch.zeros(columns, columns, dtype=torch.float64, device=device)
        self.cross = torch.zeros(columns, layer.out_features, dtype=torch.float64, device=device)
        self.tokens = 0

    @torch.no_grad()
    def add(self, inputs: torch.Tensor, targets: torch.Tensor, weight: float = 1.0) -> None:
        """Adds tokens: ``inputs [..., in_features]`` and the layer outputs wanted for them ``[..., out_features]``,
        each counted ``weight`` times."""
        a = inputs.reshape(-1, self.layer.in_features).double()
        t = targets.reshape(-1, self.layer.out_features).double()
        if self.layer.bias is not None:
            a = torch.cat([a, torch.ones_like(a[:, :1])], dim=1)
        if weight != 1.0:
            a, t = a * weight ** 0.5, t * weight ** 0.5
        # float64 products: the normal equations square the inputs' condition number (hidden states of nearby tokens
        # are strongly correlated), and float32 products left 1e-4 errors where the exact fit reaches 1e-6
        self.gram += a.T @ a
        self.cross += a.T @ t
        self.tokens += a.shape[0]

    @torch.no_grad()
    def solve(self, damping: Damping = DAMPING, damp_fraction: float = DAMP_FRACTION,
              reduce: Optional[Reduce] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``(weight, bias)`` of the ridge least-squares fit, in the layer's dtype (bias None without one).

        ``λ = damp_fraction * stat(diag(AᵀA))`` over the input columns (``stat``: ``damping``, mean / max / p95), so
        it scales with the data and is the same for any number of processes; ``reduce`` sums the statistics over
        processes first."""
        if reduce is not None:
            reduce(self.gram)
            reduce(self.cross)
        width = self.layer.in_features
        diag = torch.diagonal(self.gram)[:width]
        stats = {"mean": diag.mean, "max": diag.max, "p95": lambda: torch.quantile(diag, 0.95)}
        if damping not in stats:
            raise ValueError(f"damping must be one of {sorted(stats)}, got {damping!r}")
        # A floor relative to the largest input keeps the system definite when every input is (nearly) dead.
        lam = max(damp_fraction * float(stats[damping]()), 1e-10 * float(diag.max()), 1e-12)
        current = self.layer.weight.detach().double().T  # [in, out]: what the ridge pulls toward
        lhs = self.gram.clone()
        rhs = self.cross.clone()
        lhs.diagonal()[:width] += lam
        rhs[:width] += lam * current
        if self.layer.bias is not None:
            # The bias is free, but a vanishing pull keeps the system definite when no token was added.
            lhs[width, width] += 1e-12 * max(float(lhs[width, width]), 1.0)
            rhs[width] += 1e-12 * max(float(lhs[width, width]), 1.0) * self.layer.bias.detach().double()
        solution = torch.linalg.solve(lhs, rhs)  # symmetric positive definite by construction
        dtype = self.layer.weight.dtype
        weight = solution[:width].T.contiguous().to(dtype)
        bias = solution[width].to(dtype) if self.layer.bias is not None else None
        return weight, bias


def branch_scales(block: nn.Module) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """The layer scales of a pre-norm block's attention and MLP branches (None: no scale), or a clear refusal for a
    block whose branches do not enter the residual stream as ``x + g * branch`` (post-norm blocks)."""
    if type(block) is Block:  # noqa: E721 (subclasses may reorder the residual, e.g. ResPostBlock)
        return tuple(ls.gamma.detach() if isinstance(ls, LayerScale) else None for ls in (block.ls1, block.ls2))
    if type(block) is EvaBlock:  # noqa: E721 (EvaBlockPostNorm normalises the branch before the sum)
        return tuple(g.detach() if g is not None else None for g in (block.gamma_1, block.gamma_2))
    raise UnsupportedModelError(
        f"correction.method dense_fit needs pre-norm blocks (timm's Block or EvaBlock), got {type(block).__name__}: "
        "use correction.method sparsegpt for this model")


def _through_scale(drift: torch.Tensor, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """What a branch must add (before its layer scale ``scale``) to cancel ``drift`` in the residual stream; channels
    whose scale is 0 cannot, and get no share."""
    if scale is None:
        return drift
    usable = scale != 0
    return torch.where(usable, drift / torch.where(usable, scale, torch.ones_like(scale)), torch.zeros_like(drift))


class _Capture:
    """A forward hook that keeps the last input and output of a module."""

    def __init__(self, module: nn.Module):
        self.input = self.output = None
        self.handle = module.register_forward_hook(self)

    def __call__(self, _module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        self.input, self.output = inputs[0], output


def _attention(block: nn.Module, x: torch.Tensor, kwargs: dict) -> torch.Tensor:
    return block.attn(block.norm1(x), **kwargs)


def output_pooling(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The linear pooling of tokens ``[B, T, D] -> [B, D]`` closest to what the model's output reads: the class
    token (a distilled DeiT: the mean of its class and distillation tokens), the mean of the patch tokens (average
    pooling), or the mean of all tokens (an attention pool)."""
    pool = getattr(model, "global_pool", "token")
    prefix = getattr(model, "num_prefix_tokens", 1)
    if pool == "token":
        readout = 2 if getattr(model, "dist_token", None) is not None else 1
        return lambda x: x[:, :readout].mean(dim=1)
    if pool in ("avg", "avgmax", "max"):
        return lambda x: x[:, prefix:].mean(dim=1)
    return lambda x: x.mean(dim=1)


#: The variants of a corrected block, in the order a tie on the held-out images prefers them (the simplest first).
VARIANTS = ("as cut", "fitted", "reconstructed")


@torch.no_grad()
def fit_to_dense_and_prune(
    model: nn.Module,
    subnet: Subnet,
    images: torch.Tensor,
    batch_size: int = BATCH_SIZE,
    damping: Damping = DAMPING,
    damp_fraction: float = DAMP_FRACTION,
    reduce: Optional[Reduce] = None,
    refit: Refit = "pruned",
    output_weight: float = 0.0,
    reconstruct: Optional[Reconstruction] = None,
    held_out: Optional[torch.Tensor] = None,
    choices: Optional[list[dict[str, Any]]] = None,
    progress: ProgressMode | bool = False,
) -> nn.Module:
    """Prune ``model`` to ``subnet`` in place, refitting each pruned block's ``attn.proj`` and ``mlp.fc2`` (weight
    and bias) so that the block's output matches the dense model's output of that block on calibration images.

    Blocks that lose no unit are left bitwise unchanged; so is everything outside the blocks.

    Args:
        model: a dense supported timm ViT with pre-norm blocks (pass a copy to keep the original).
        subnet: kept heads / neurons per block.
        images: calibration images ``[N, C, H, W]`` the fit (and the reconstruction steps) use, moved to the model's
            device batch by batch.
        batch_size: images per forward pass.
        damping, damp_fraction: the ridge, ``damp_fraction`` times the ``damping`` statistic of ``diag(AᵀA)``.
        reduce: sums each statistic over processes that hold other calibration images (``dist.all_reduce``); every
            process then computes the same weights.
        refit: ``pruned``: the blocks that lose units; ``following``: every block from the first that loses units
            to the last (the blocks that lose nothing absorb drift too).
        output_weight: extra weight of what the output reads (:func:`output_pooling` of the tokens) in the last
            block's fit, as a multiple of all that image's tokens together (0: every token alike).
        reconstruct: after each block's fit, gradient steps on all of its parameters toward the dense block's
            output (:class:`Reconstruction`; None: none).
        held_out: images neither the fit nor the steps use: each corrected block keeps the variant (:data:`VARIANTS`:
            as cut, fitted, fitted and reconstructed) whose output is closest to the dense block's on them, and the
            reconstruction keeps its best step on them (None: every block keeps its fit, and the steps keep their
            best on the last tenth of ``images``, which the fit has used: :func:`tail_aside`).
        choices: receives one entry per corrected block: ``{"block", "kept", "held_out_error": {variant: error}}``.
        progress: show progress over blocks (a :class:`snapvit_pl.progress.Progress` mode).

    Returns:
        ``model``, with the architecture of ``prune_(model, subnet)``.
    """
    check_value("refit", refit, Refit)  # (a run's word is checked once, by CorrectionSettings; a caller's here)
    subnet, dense, todo = blocks_losing_units(model, subnet)
    if not todo:
        return model
    if refit == "following":
        todo = list(range(todo[0], len(model.blocks)))
    for b in todo:
        branch_scales(model.blocks[b])  # refuse an unsupported block before anything changes
    was_training = model.training
    model.eval()
    fitted_rows = len(images)
    if held_out is not None and len(held_out):
        images = torch.cat([images, held_out.to(images.device, images.dtype)])
    pruned_stream, rope = block_inputs(model, images, batch_size)
    dense_stream = pruned_stream.clone()
    rows = len(pruned_stream)
    batches = [slice(i, i + batch_size) for i in range(0, rows, batch_size)]
    fit_batches = [slice(i, min(i + batch_size, fitted_rows)) for i in range(0, fitted_rows, batch_size)]
    check = slice(fitted_rows, rows) if rows > fitted_rows else None
    stepping = reconstruct is not None and reconstruct.steps > 0
    if stepping:
        reconstruct.start_model()
    with Progress("correction", todo[-1] + 1, progress, unit="block") as bar:
        for b in range(todo[-1] + 1):
            kwargs = block_kwargs(model, rope, b)
            if b not in todo:
                for s in batches:  # the same block on both streams: the drift travels on
                    pruned_stream[s] = model.blocks[b](pruned_stream[s], **kwargs)
                    dense_stream[s] = model.blocks[b](dense_stream[s], **kwargs)
                bar.update()
                continue
            reference = copy.deepcopy(model.blocks[b])  # this block's dense weights (one block), for the targets
            selection = Subnet.full(model)
            selection.heads[b], selection.neurons[b] = subnet.heads[b], subnet.neurons[b]
            prune_(model, selection)
            block = model.blocks[b]
            errors, states = {}, {}
            if check is not None:  # each variant's error on the held-out images, and its weights (one block)
                targets = reference(dense_stream[check], **kwargs)

                def keep(variant: str) -> None:
                    errors[variant] = block_error(block, pruned_stream[check], targets, kwargs, batch_size)
                    states[variant] = {k: v.clone() for k, v in block.state_dict().items()}

                keep("as cut")
            readout = output_pooling(model) if output_weight > 0 and b == len(model.blocks) - 1 else None
            _refit_block(block, reference, pruned_stream, dense_stream, fit_batches, kwargs,
                         dict(damping=damping, damp_fraction=damp_fraction, reduce=reduce), readout, output_weight)
            if check is not None:
                keep("fitted")
            if stepping or b < todo[-1]:
                for s in batches:
                    dense_stream[s] = reference(dense_stream[s], **kwargs)  # the block's targets, the next inputs
            if stepping:
                train, steps_check = (slice(0, fitted_rows), check) if check is not None else \
                    tail_aside(fitted_rows)
                reconstruct.run(block, pruned_stream, dense_stream, kwargs, seed=b, train=train, check=steps_check,
                                blocks_left=sum(1 for t in todo if t >= b))
                if check is not None and reconstruct.log[-1]["steps_kept"] > 0:
                    keep("reconstructed")
            if check is not None:
                kept = min(errors, key=lambda v: (_finite_or_inf(errors[v]), VARIANTS.index(v)))
                if kept != list(errors)[-1]:
                    block.load_state_dict(states[kept])
                if choices is not None:
                    choices.append({"block": b, "kept": kept, "held_out_error": errors})
            if b < todo[-1]:
                for s in batches:
                    pruned_stream[s] = block(pruned_stream[s], **kwargs)
            bar.update()
    model.train(was_training)
    return model


def _finite_or_inf(value: float) -> float:
    return value if math.isfinite(value) else math.inf


def _refit_block(block: nn.Module, reference: nn.Module, pruned_stream: torch.Tensor, dense_stream: torch.Tensor,
                 batches: list[slice], kwargs: dict, options: dict,
                 readout: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, output_weight: float = 0.0) -> None:
    """Refits ``block``'s ``attn.proj``, then its ``mlp.fc2``, to the dense ``reference`` block's outputs (the
    ``readout`` of the tokens counted ``output_weight`` times all the tokens of an image besides)."""

    def add(fit: RidgeFit, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        fit.add(inputs, targets)
        if readout is not None:
            fit.add(readout(inputs), readout(targets), output_weight * inputs.shape[1])

    g1, g2 = branch_scales(block)
    # 1. attn.proj: the intermediate x + g1 * attn(...) toward the dense block's.
    fit = RidgeFit(block.attn.proj)
    capture = _Capture(block.attn.proj)
    try:
        for s in batches:
            x, x_d = pruned_stream[s], dense_stream[s]
            _attention(block, x, kwargs)
            add(fit, capture.input, _attention(reference, x_d, kwargs) + _through_scale(x_d - x, g1))
    finally:
        capture.handle.remove()
    _write(block.attn.proj, *fit.solve(**options))
    del fit
    # 2. mlp.fc2: the block's output x1 + g2 * mlp(...) toward the dense block's, on the corrected x1.
    fit = RidgeFit(block.mlp.fc2)
    capture = _Capture(block.mlp.fc2)
    try:
        for s in batches:
            x, x_d = pruned_stream[s], dense_stream[s]
            x1 = x + _scaled(_attention(block, x, kwargs), g1)
            x1_d = x_d + _scaled(_attention(reference, x_d, kwargs), g1)
            block.mlp(block.norm2(x1))
            add(fit, capture.input, reference.mlp(reference.norm2(x1_d)) + _through_scale(x1_d - x1, g2))
    finally:
        capture.handle.remove()
    _write(block.mlp.fc2, *fit.solve(**options))


def _scaled(branch: torch.Tensor, scale: Optional[torch.Tensor]) -> torch.Tensor:
    return branch if scale is None else branch * scale


def _write(layer: nn.Linear, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    layer.weight.copy_(weight)
    if bias is not None:
        layer.bias.copy_(bias)
