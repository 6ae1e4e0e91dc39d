"""Structured pruning with SparseGPT-style correction, block by block.

For each block in order, the calibration hidden states entering it come from the blocks before it
*after* they were corrected and pruned, so every correction sees the inputs the final model sees:

1. run the dense-width block, collect the inputs of ``attn.proj``, correct ``proj`` to the kept
   heads' columns, prune the block's heads and write the corrected weight;
2. re-run the block (pruned attention), collect the inputs of ``mlp.fc2``, correct it to the kept
   neurons' columns, prune the neurons and write the corrected weight;
3. run the corrected block once more: its outputs are the next block's calibration inputs.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, Optional, Union

import torch
from torch import nn

from ..errors import ConfigError
from ..models.surgery import prune_
from ..models.tokens import block_kwargs, embed_tokens
from ..models.units import Subnet, prunable_blocks
from ..progress import Progress, ProgressMode
from ..ranges import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, check_fields, one_of
from .sparsegpt import BLOCK_SIZE, DAMP_FRACTION, DAMPING, ColumnCorrector, Damping

#: Block-wise reconstruction's steps per pruned block where ``reconstruct_steps: auto`` runs it (an accelerator), and
#: its learning rate: chosen on the development models (docs/method.md, section 4).
RECONSTRUCT_STEPS = 1000
RECONSTRUCT_LR = 1e-3

#: The correction methods (``correction.method``) and which layers the fit refits (``correction.refit``).
Method = one_of("dense_fit", "sparsegpt", "bias")
Refit = one_of("pruned", "following")

# (unit group, the Linear whose input columns it owns), in the order they are corrected.
_STAGES = (("heads", "proj"), ("neurons", "fc2"))


#: The settings that only some correction methods read (any other method refuses a value other than the default).
METHOD_SETTINGS = {"refit": ("dense_fit",), "output_weight": ("dense_fit",), "reconstruct_steps": ("dense_fit",),
                   "reconstruct_lr": ("dense_fit",), "block_size": ("sparsegpt",),
                   "damping": ("sparsegpt", "dense_fit"), "damp_fraction": ("sparsegpt", "dense_fit")}


@dataclass
class CorrectionSettings:
    """Weight correction of extracted models (off by default; docs/method.md, section 4, says why).

    Args:
        enabled: correct each extracted model (``attn.proj`` / ``mlp.fc2`` of the blocks that lose units): ``true``,
            ``false`` (the default), or ``auto``: on when the run's device is an accelerator, where it costs seconds
            per model, off on the CPU, where it costs minutes per model at full size (see :meth:`active`).
        method: ``dense_fit`` (the default: each pruned block's ``proj`` / ``fc2`` refitted, weight and bias, to the
            dense model's output of that block, residual stream included:
            :func:`snapvit_pl.correction.fit_to_dense_and_prune`; docs/method.md, section 4, has the measurements),
            ``sparsegpt`` (an OBS update of the kept columns toward each layer's own output, :func:`correct_and_prune`;
            SnapViT's) or ``bias`` (FLAP's bias compensation: the removed channels' mean input folded into the bias,
            :func:`snapvit_pl.correction.compensate_bias_and_prune`; FLAP as published is ``importance.scorer: FLAP``,
            ``importance.allocation: standardized`` and this).
        num_samples: calibration images (plain views of a seeded subset of the pruning data).
        batch_size: images per forward pass.
        damping: how the damping (``sparsegpt``: of the Hessian, :meth:`snapvit_pl.correction.ColumnCorrector.correct`;
            ``dense_fit``: the ridge, :meth:`snapvit_pl.correction.RidgeFit.solve`) scales with the inputs'
            second moments (DINOv3: ``max``).
        damp_fraction: the damping's fraction of that scale (DINOv3: ``0.1``).
        block_size: columns updated together (see :meth:`snapvit_pl.correction.ColumnCorrector.correct`).
        refit: ``dense_fit`` only: ``pruned`` refits the blocks that lose units, ``following`` every block from the
            first of them to the last (those that lose nothing absorb the drift too).
        output_weight: ``dense_fit`` only: extra weight of the tokens the output reads (class token, or the mean of
            the patch tokens) in the last block's fit, as a multiple of all of an image's tokens (0: none).
        reconstruct_steps: ``dense_fit`` only: gradient steps (Adam) per pruned block on all of its parameters
            toward the dense block's output after the fit (block-wise reconstruction; 0: none), a tenth of the
            calibration images held out to keep the best step (:class:`snapvit_pl.correction.Reconstruction`);
            ``auto`` (the default): :data:`RECONSTRUCT_STEPS` on an accelerator, where they cost seconds per model,
            none on the CPU, where they cost hours at full size (see :meth:`steps_on`).
        reconstruct_lr: their learning rate.
    """

    enabled: Union[bool, Literal["auto"]] = False
    method: Method = "dense_fit"
    num_samples: PositiveInt = 1000
    batch_size: PositiveInt = 64
    damping: Damping = DAMPING
    damp_fraction: NonNegativeFloat = DAMP_FRACTION
    block_size: PositiveInt = BLOCK_SIZE
    refit: Refit = "pruned"
    output_weight: NonNegativeFloat = 0.0
    reconstruct_steps: Union[NonNegativeInt, Literal["auto"]] = "auto"
    reconstruct_lr: PositiveFloat = RECONSTRUCT_LR

    def __post_init__(self) -> None:
        check_fields(self, "correction")
        for name, methods in METHOD_SETTINGS.items():
            value, default = getattr(self, name), next(f.default for f in fields(self) if f.name == name)
            if self.method not in methods and value != default:
                raise ConfigError(f"correction.{name} {value!r} applies to correction.method {' or '.join(methods)} "
                                  f"only, and the method is {self.method}; remove it, or choose the method it "
                                  "applies to")

    def active(self, device: torch.device | str) -> bool:
        """Whether models cut on ``device`` are corrected: ``enabled``, with ``auto`` meaning any device but the CPU."""
        if self.enabled == "auto":
            return torch.device(device).type != "cpu"
        return bool(self.enabled)

    def steps_on(self, device: torch.device | str) -> int:
        """Reconstruction steps per pruned block for models corrected on ``device``: ``reconstruct_steps``, with
        ``auto`` meaning :data:`RECONSTRUCT_STEPS` on any device but the CPU and none on the CPU."""
        if self.reconstruct_steps == "auto":
            return RECONSTRUCT_STEPS if torch.device(device).type != "cpu" else 0
        return int(self.reconstruct_steps)


@torch.no_grad()
def correct_and_prune(
    model: nn.Module,
    subnet: Subnet,
    images: torch.Tensor,
    settings: Optional[CorrectionSettings] = None,
    progress: ProgressMode | bool = False,
) -> nn.Module:
    """Prune ``model`` to ``subnet`` in place, correcting ``attn.proj``/``mlp.fc2`` on calibration images.

    Blocks that lose no unit are left bitwise unchanged; so is everything outside the blocks.

    Args:
        model: a dense supported timm ViT (pass a copy to keep the original).
        subnet: kept heads / neurons per block.
        images: calibration images ``[N, C, H, W]`` (moved to the model's device batch by batch).
        settings: ``batch_size`` (images per forward pass) and ``damping``, ``damp_fraction``, ``block_size``
            (passed to :meth:`ColumnCorrector.correct`); default :class:`CorrectionSettings`.
        progress: show progress over blocks (a :class:`snapvit_pl.progress.Progress` mode).

    Returns:
        ``model``, with the architecture of ``prune_(model, subnet)``.
    """
    settings = settings or CorrectionSettings()
    batch_size = settings.batch_size
    subnet, dense, todo = _blocks_losing_units(model, subnet)
    if not todo:
        return model
    was_training = model.training
    model.eval()
    cache, rope = _block_inputs(model, images, batch_size)
    options = dict(block_size=settings.block_size, damping=settings.damping, damp_fraction=settings.damp_fraction)
    with Progress("correction", todo[-1] + 1, progress, unit="block") as bar:
        for b in range(todo[-1] + 1):
            kwargs = block_kwargs(model, rope, b)
            for group_name, layer_name in _STAGES:
                keep = getattr(subnet, group_name)[b]
                if len(keep) < len(getattr(dense, group_name)[b]):
                    _correct_group(model, b, group_name, layer_name, keep, cache, kwargs, batch_size, options)
            if b < todo[-1]:
                _run(model.blocks[b], cache, kwargs, batch_size, write=True)
            bar.update()
    model.train(was_training)
    return model


def _blocks_losing_units(model: nn.Module, subnet: Subnet) -> tuple[Subnet, Subnet, list[int]]:
    """``(subnet validated, the dense subnet, the indices of the blocks that lose a head or a neuron)``."""
    subnet = subnet.validate(model)
    dense = Subnet.full(model)
    todo = [b for b in range(len(model.blocks))
            if any(len(getattr(subnet, g)[b]) < len(getattr(dense, g)[b]) for g, _ in _STAGES)]
    return subnet, dense, todo


def _block_inputs(model: nn.Module, images: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The first block's input tokens of every calibration image (on the model's device), and the rotary embedding."""
    device = next(model.parameters()).device
    chunks = [embed_tokens(model, images[i:i + batch_size].to(device)) for i in range(0, len(images), batch_size)]
    return torch.cat([x for x, _ in chunks]), chunks[0][1]


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
        _run(model.blocks[b], cache, kwargs, batch_size, write=False)
    finally:
        handle.remove()
    # prune_ slices the columns in the same order as group.index (keep is sorted by validate).
    weight = corrector.correct(group.index(keep, slot), **options)
    del corrector  # frees the Hessian before the next layer's is allocated
    selection = Subnet.full(model)
    getattr(selection, group_name)[b] = keep
    prune_(model, selection)
    layer.weight.copy_(weight)


def _run(block: nn.Module, cache: torch.Tensor, kwargs: dict, batch_size: int, write: bool) -> None:
    """Runs ``block`` over ``cache`` in batches; with ``write`` its outputs replace ``cache`` in place."""
    for i in range(0, len(cache), batch_size):
        out = block(cache[i:i + batch_size], **kwargs)
        if write:
            cache[i:i + batch_size] = out
