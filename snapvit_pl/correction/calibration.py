"""The calibration stream every correction method shares: the blocks a sub-network cuts, the first block's input
tokens of the calibration images, and a block run over them batch by batch (its outputs becoming the next block's
inputs). Each method corrects block after block on the inputs the final model sees (the blocks before already
corrected and pruned)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..models.tokens import embed_tokens
from ..models.units import Subnet

#: Calibration images per forward pass, unless the caller says (``correction.batch_size``).
BATCH_SIZE = 64
#: (unit group, the Linear whose input columns it owns), in the order they are corrected.
STAGES = (("heads", "proj"), ("neurons", "fc2"))


def blocks_losing_units(model: nn.Module, subnet: Subnet) -> tuple[Subnet, Subnet, list[int]]:
    """``(subnet validated, the dense subnet, the indices of the blocks that lose a head or a neuron)``."""
    subnet = subnet.validate(model)
    dense = Subnet.full(model)
    todo = [b for b in range(len(model.blocks))
            if any(len(getattr(subnet, g)[b]) < len(getattr(dense, g)[b]) for g, _ in STAGES)]
    return subnet, dense, todo


def block_inputs(model: nn.Module, images: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The first block's input tokens of every calibration image (on the model's device), and the rotary embedding."""
    device = next(model.parameters()).device
    chunks = [embed_tokens(model, images[i:i + batch_size].to(device)) for i in range(0, len(images), batch_size)]
    return torch.cat([x for x, _ in chunks]), chunks[0][1]


def run_block(block: nn.Module, cache: torch.Tensor, kwargs: dict, batch_size: int, write: bool) -> None:
    """Runs ``block`` over ``cache`` in batches; with ``write`` its outputs replace ``cache`` in place."""
    for i in range(0, len(cache), batch_size):
        out = block(cache[i:i + batch_size], **kwargs)
        if write:
            cache[i:i + batch_size] = out
