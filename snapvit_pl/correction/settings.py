"""The correction's settings, defined once: which method, on how many calibration images, and each method's own
settings (:data:`METHOD_SETTINGS` says which method reads which; another method refuses a value other than the
default). The methods: ``dense_fit`` (:mod:`.dense_fit`), ``sparsegpt`` (:mod:`.sparsegpt`), ``bias`` (:mod:`.bias`)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, Optional, Union

import torch
from torch import nn

from ..errors import ConfigError
from ..ranges import HalfOpenUnitInterval, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, check_fields, one_of
from .calibration import BATCH_SIZE
from .guard import is_headless
from .sparsegpt import BLOCK_SIZE, DAMP_FRACTION, DAMPING, Damping

#: Block-wise reconstruction's steps per pruned block where ``reconstruct_steps: auto`` runs it (an accelerator), and
#: its learning rate: chosen on the development models (docs/method.md, section 4).
RECONSTRUCT_STEPS = 1000
RECONSTRUCT_LR = 1e-3
#: Steps without a lower held-out error after which a block's reconstruction stops.
RECONSTRUCT_PATIENCE = 200
#: Share of the calibration images held out before anything is fitted (what each block's variant and the output
#: check are judged on) where ``held_out`` is not given: none yet (docs/method.md, section 4, measured 0.2).
HELD_OUT = 0.0

#: The correction methods (``correction.method``) and which layers the fit refits (``correction.refit``).
Method = one_of("dense_fit", "sparsegpt", "bias")
Refit = one_of("pruned", "following")

#: The settings that only some correction methods read (any other method refuses a value other than the default).
METHOD_SETTINGS = {"refit": ("dense_fit",), "output_weight": ("dense_fit",), "reconstruct_steps": ("dense_fit",),
                   "reconstruct_lr": ("dense_fit",), "reconstruct_patience": ("dense_fit",),
                   "reconstruct_seconds": ("dense_fit",), "block_size": ("sparsegpt",),
                   "damping": ("sparsegpt", "dense_fit"), "damp_fraction": ("sparsegpt", "dense_fit")}


@dataclass
class CorrectionSettings:
    """Weight correction of extracted models (docs/method.md, section 4, says what was measured and decided).

    Args:
        enabled: correct each extracted model (``attn.proj`` / ``mlp.fc2`` of the blocks that lose units): ``false``
            (the default) none, ``true`` every model, ``auto`` the models of a backbone with a classifier, leaving a
            headless backbone's as cut (on the self-supervised development model a correction lowered k-NN accuracy
            where no label-free check could see it; see :meth:`active`).
        method: ``dense_fit`` (the default: each pruned block's ``proj`` / ``fc2`` refitted, weight and bias, to the
            dense model's output of that block, residual stream included:
            :func:`snapvit_pl.correction.fit_to_dense_and_prune`; docs/method.md, section 4, has the measurements),
            ``sparsegpt`` (an OBS update of the kept columns toward each layer's own output, :func:`correct_and_prune`;
            SnapViT's) or ``bias`` (FLAP's bias compensation: the removed channels' mean input folded into the bias,
            :func:`snapvit_pl.correction.compensate_bias_and_prune`; FLAP as published is ``importance.scorer: FLAP``,
            ``importance.allocation: standardized`` and this).
        num_samples: calibration images (plain views of a seeded subset of the pruning data).
        held_out: share of the calibration images set aside before anything is fitted. Each model is judged on them:
            a ``dense_fit`` block keeps whichever of its weights as cut, fitted, or fitted and reconstructed is closest
            to the dense block's output on them, and the corrected model is kept only when its output embedding is
            at least as close to the dense model's as the model as cut (for a model without a classifier, also each
            image's nearest neighbours; :class:`snapvit_pl.correction.guard.OutputGuard`). 0: nothing held out,
            every correction kept unchecked (the default; the reconstruction steps then keep their best step on the
            last tenth of the images the fit used). docs/method.md, section 4, measured 0.2.
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
            toward the dense block's output after the fit (block-wise reconstruction; 0: none), the best step on the
            held-out images kept (:class:`snapvit_pl.correction.Reconstruction`);
            ``auto`` (the default): :data:`RECONSTRUCT_STEPS` on an accelerator, where they cost seconds per model,
            none on the CPU, where they cost hours at full size (see :meth:`steps_on`).
        reconstruct_lr: their learning rate.
        reconstruct_patience: a block's steps stop after this many without a lower held-out error (null: never
            early).
        reconstruct_seconds: at most this many seconds of steps per model, shared by its pruned blocks (null: no
            limit; a time limit makes the result depend on the machine's speed).
    """

    enabled: Union[bool, Literal["auto"]] = False
    method: Method = "dense_fit"
    num_samples: PositiveInt = 1000
    held_out: HalfOpenUnitInterval = HELD_OUT
    batch_size: PositiveInt = BATCH_SIZE
    damping: Damping = DAMPING
    damp_fraction: NonNegativeFloat = DAMP_FRACTION
    block_size: PositiveInt = BLOCK_SIZE
    refit: Refit = "pruned"
    output_weight: NonNegativeFloat = 0.0
    reconstruct_steps: Union[NonNegativeInt, Literal["auto"]] = "auto"
    reconstruct_lr: PositiveFloat = RECONSTRUCT_LR
    reconstruct_patience: Optional[PositiveInt] = RECONSTRUCT_PATIENCE
    reconstruct_seconds: Optional[PositiveFloat] = None

    def __post_init__(self) -> None:
        check_fields(self, "correction")
        for name, methods in METHOD_SETTINGS.items():
            value, default = getattr(self, name), next(f.default for f in fields(self) if f.name == name)
            if self.method not in methods and value != default:
                raise ConfigError(f"correction.{name} {value!r} applies to correction.method {' or '.join(methods)} "
                                  f"only, and the method is {self.method}; remove it, or choose the method it "
                                  "applies to")

    def active(self, model: nn.Module) -> bool:
        """Whether the models cut from ``model`` are corrected: ``enabled``, with ``auto`` meaning a backbone with a
        classifier (:func:`snapvit_pl.correction.guard.is_headless`)."""
        if self.enabled == "auto":
            return not is_headless(model)
        return bool(self.enabled)

    def steps_on(self, device: torch.device | str) -> int:
        """Reconstruction steps per pruned block for models corrected on ``device``: ``reconstruct_steps``, with
        ``auto`` meaning :data:`RECONSTRUCT_STEPS` on any device but the CPU and none on the CPU."""
        if self.reconstruct_steps == "auto":
            return RECONSTRUCT_STEPS if torch.device(device).type != "cpu" else 0
        return int(self.reconstruct_steps)
