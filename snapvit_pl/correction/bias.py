"""FLAP's bias compensation: removed input channels replaced by their mean, folded into the bias.

FLAP (An et al., "Fluctuation-based Adaptive Structured Pruning for Large Language Models",
AAAI 2024) removes input channels of the output projections (``attn.proj`` loses the columns of
removed heads, ``mlp.fc2`` those of removed neurons) and adds what those channels contributed on
average: ``b += W[:, removed] @ mean(X[:, removed])`` over calibration tokens. On the calibration
data the layer's mean output is then unchanged; only the channels' fluctuation around their mean
is lost (which FLAP's metric, :class:`snapvit_pl.scoring.FLAP`, ranks by).

Blocks are processed in order, and the means of each block are measured on the hidden states the
blocks before it produce *after* their own pruning and compensation (as the SparseGPT correction
does, :func:`snapvit_pl.correction.correct_and_prune`), so every mean is the one the final model sees.
"""
from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm

from ..models.surgery import prune_
from ..models.units import Subnet, prunable_blocks
from ..models.tokens import block_kwargs
from .calibration import BATCH_SIZE, STAGES, block_inputs, blocks_losing_units, run_block


class _InputMean:
    """Running mean of a Linear's input over every token it sees (float64)."""

    def __init__(self, layer: nn.Linear):
        self.sum = torch.zeros(layer.in_features, dtype=torch.float64, device=layer.weight.device)
        self.count = 0

    def __call__(self, _module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        x = inputs[0].detach().reshape(-1, inputs[0].shape[-1])
        self.sum += x.double().sum(dim=0)
        self.count += x.shape[0]

    @property
    def mean(self) -> torch.Tensor:
        return self.sum / max(self.count, 1)


@torch.no_grad()
def compensate_bias_and_prune(
    model: nn.Module, subnet: Subnet, images: torch.Tensor, batch_size: int = BATCH_SIZE, progress: bool = False,
) -> nn.Module:
    """Prune ``model`` to ``subnet`` in place, folding the removed channels' mean into ``proj`` / ``fc2`` biases.

    Blocks that lose no unit are left bitwise unchanged; so is everything outside the blocks.

    Args:
        model: a dense supported timm ViT (pass a copy to keep the original).
        subnet: kept heads / neurons per block.
        images: calibration images ``[N, C, H, W]`` (moved to the model's device batch by batch).
        batch_size: images per forward pass.
        progress: show a progress bar over blocks.

    Returns:
        ``model``, with the architecture of ``prune_(model, subnet)``.

    Raises:
        ValueError: an output projection that loses channels has no bias to compensate into.
    """
    subnet, dense, todo = blocks_losing_units(model, subnet)
    if not todo:
        return model
    for b in todo:
        for group_name, layer_name in STAGES:
            layer = getattr(getattr(prunable_blocks(model)[b], group_name).module, layer_name)
            if len(getattr(subnet, group_name)[b]) < len(getattr(dense, group_name)[b]) and layer.bias is None:
                raise ValueError(f"blocks.{b} {layer_name} has no bias: bias compensation needs one "
                                 "(use correct_and_prune or plain pruning for this model)")
    was_training = model.training
    model.eval()
    cache, rope = block_inputs(model, images, batch_size)
    for b in tqdm(range(todo[-1] + 1), desc="bias compensation", disable=not progress):
        kwargs = block_kwargs(model, rope, b)
        for group_name, layer_name in STAGES:
            keep = getattr(subnet, group_name)[b]
            if len(keep) == len(getattr(dense, group_name)[b]):
                continue
            group = getattr(prunable_blocks(model)[b], group_name)
            layer = getattr(group.module, layer_name)
            statistic = _InputMean(layer)
            handle = layer.register_forward_pre_hook(statistic)
            try:
                run_block(model.blocks[b], cache, kwargs, batch_size, write=False)
            finally:
                handle.remove()
            removed = torch.ones(layer.in_features, dtype=torch.bool, device=layer.weight.device)
            slot = next(s for s in group.slots if s.path == f"{layer_name}.weight")
            removed[group.index(keep, slot)] = False
            shift = layer.weight.detach().double()[:, removed] @ statistic.mean[removed]
            layer.bias.add_(shift.to(layer.bias.dtype))
            selection = Subnet.full(model)
            getattr(selection, group_name)[b] = keep
            prune_(model, selection)
        if b < todo[-1]:
            run_block(model.blocks[b], cache, kwargs, batch_size, write=True)
    model.train(was_training)
    return model
