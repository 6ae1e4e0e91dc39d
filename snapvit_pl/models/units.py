"""A uniform view of the prunable units (attention heads, MLP hidden neurons) of timm ViTs.

Every supported attention and MLP module is described by a *layout*: the list of tensors that
carry one slice per unit, the tensor dimension the units live on, and how many equal sections
that dimension has (3 for a fused ``qkv``, 2 for a packed gated ``fc1``, 1 otherwise). Gathered
forward passes and physical surgery both work from the same layout, so they cannot disagree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator, Optional, Sequence

import torch
from torch import nn
from timm.layers import Attention, AttentionRope, GluMlp, Mlp, SwiGLU
from timm.models.eva import Eva, EvaAttention
from timm.models.vision_transformer import VisionTransformer

from ..errors import PruningSpecError, UnsupportedModelError

SUPPORTED_MODELS = (VisionTransformer, Eva)  # VisionTransformerDistilled subclasses VisionTransformer
SUPPORTED_ATTENTION = (Attention, EvaAttention, AttentionRope)
SUPPORTED_MLP = (Mlp, GluMlp, SwiGLU)

#: Why known timm architectures (model or block classes) are refused.
REFUSED = {
    "Beit": "BEiT attention keeps a relative-position bias table per head (and fixed q/v biases) that head "
            "pruning would have to slice; not implemented",
    "NaFlexVit": "NaFlexVit takes variable-resolution patch sequences with masks, but pruning needs fixed-size "
                 "image inputs (fitness, cost model, surgery tests)",
    "ParallelThingsBlock": "its attention and MLP run as parallel branches (lists attns/ffns), not one attn and one "
                           "mlp per block",
    "ParallelScalingBlock": "its attention and MLP share one fused input projection (in_proj), so heads and MLP "
                            "neurons cannot be cut apart",
}


@dataclass(frozen=True)
class Slot:
    """One tensor that holds a slice per unit.

    Args:
        path: attribute path inside the attention/MLP module, e.g. ``"qkv.weight"``.
        dim: tensor dimension indexed by units.
        sections: number of equal sections along ``dim`` (3 for fused qkv, 2 for packed GLU fc1).
    """

    path: str
    dim: int = 0
    sections: int = 1


@dataclass(frozen=True)
class UnitGroup:
    """The prunable units of one attention or MLP module.

    Args:
        module: the timm module (``block.attn`` or ``block.mlp``).
        num_units: number of heads or hidden neurons.
        unit_size: entries per unit inside each section (``head_dim`` for heads, 1 for neurons).
        slots: tensors to slice, all present on ``module``.
    """

    module: nn.Module
    num_units: int
    unit_size: int
    slots: tuple[Slot, ...]

    @cached_property
    def holders(self) -> tuple[tuple[nn.Module, str], ...]:
        """Per slot, the module that holds its tensor and the tensor's name there (looked up once: a search gathers
        thousands of sub-networks through them)."""
        return tuple(_holder(self.module, slot.path) for slot in self.slots)

    def index(self, keep: torch.Tensor, slot: Slot, device: Optional[torch.device] = None) -> torch.Tensor:
        """Indices along ``slot.dim`` that belong to the kept units, section by section (on ``device``; default the
        slot tensor's)."""
        device = device or _tensor(self.module, slot.path).device
        keep = keep if keep.device == device else keep.to(device=device)
        within = (keep[:, None] * self.unit_size + torch.arange(self.unit_size, device=keep.device)).flatten()
        section = self.num_units * self.unit_size
        return torch.cat([within + s * section for s in range(slot.sections)])


@dataclass(frozen=True)
class BlockUnits:
    """Heads and MLP neurons of one transformer block."""

    index: int
    heads: UnitGroup
    neurons: UnitGroup


def _holder(module: nn.Module, path: str) -> tuple[nn.Module, str]:
    """The submodule of ``module`` that holds the tensor at ``path`` and the tensor's name there."""
    owner, _, name = path.rpartition(".")
    return (module.get_submodule(owner) if owner else module), name


def _tensor(module: nn.Module, path: str) -> torch.Tensor:
    return getattr(*_holder(module, path))


def _present(module: nn.Module, path: str) -> bool:
    owner, _, name = path.rpartition(".")
    try:
        holder = module.get_submodule(owner) if owner else module
    except AttributeError:
        return False
    return isinstance(getattr(holder, name, None), torch.Tensor)


def _norm_slots(module: nn.Module, name: str) -> list[Slot]:
    return [Slot(f"{name}.{p}") for p in ("weight", "bias") if _present(module, f"{name}.{p}")]


def attention_units(attn: nn.Module, block: int | None = None) -> UnitGroup:
    """Layout of the heads of a timm ``Attention``, ``EvaAttention`` or ``AttentionRope``."""
    if isinstance(attn, AttentionRope) and attn.num_kv_heads != attn.num_heads:
        where = "" if block is None else f"block {block}: "
        raise UnsupportedModelError(
            f"{where}grouped-query attention ({attn.num_heads} query heads share {attn.num_kv_heads} key/value heads) "
            f"is not supported: pruning a query head would orphan its shared key/value head; supported: attention "
            f"with one key/value head per query head ({_supported_list()})"
        )
    rows: list[Slot] = []
    if getattr(attn, "qkv", None) is not None:
        rows += [Slot("qkv.weight", 0, 3)]
        rows += [Slot("qkv.bias", 0, 3)] if _present(attn, "qkv.bias") else []
        rows += [Slot(f"{p}_bias") for p in "qkv" if _present(attn, f"{p}_bias")]  # EVA q/k/v_bias
    else:
        rows += [Slot(f"{p}_proj.{t}") for p in "qkv" for t in ("weight", "bias") if _present(attn, f"{p}_proj.{t}")]
    if getattr(attn, "gate", None) is not None:
        rows += [Slot(f"gate.{t}") for t in ("weight", "bias") if _present(attn, f"gate.{t}")]
    rows += _norm_slots(attn, "norm")
    rows += [Slot("proj.weight", dim=1)]
    return UnitGroup(attn, attn.num_heads, attn.head_dim, tuple(rows))


def mlp_units(mlp: nn.Module) -> UnitGroup:
    """Layout of the hidden neurons of a timm ``Mlp``, ``GluMlp``/``SwiGLUPacked`` or ``SwiGLU``."""
    if isinstance(mlp, SwiGLU):
        inputs = [Slot(f"{fc}.{t}") for fc in ("fc1_g", "fc1_x") for t in ("weight", "bias") if _present(mlp, f"{fc}.{t}")]
        hidden = mlp.fc2.in_features
    else:
        if not isinstance(mlp.fc1, nn.Linear):
            raise UnsupportedModelError(f"MLP fc1 must be nn.Linear, got {type(mlp.fc1).__name__} (conv MLPs are not supported)")
        sections = 2 if isinstance(mlp, GluMlp) else 1
        inputs = [Slot(f"fc1.{t}", 0, sections) for t in ("weight", "bias") if _present(mlp, f"fc1.{t}")]
        hidden = mlp.fc2.in_features
    slots = tuple(inputs + _norm_slots(mlp, "norm") + [Slot("fc2.weight", dim=1)])
    return UnitGroup(mlp, hidden, 1, slots)


def _supported_list() -> str:
    names = lambda classes: ", ".join(c.__name__ for c in classes)  # noqa: E731
    return (
        f"models: {names(SUPPORTED_MODELS)} (incl. VisionTransformerDistilled) with one attn and one mlp per block; "
        f"attention: {names(SUPPORTED_ATTENTION)}; MLP: Mlp, GluMlp, SwiGLUPacked, SwiGLU"
    )


def prunable_blocks(model: nn.Module) -> list[BlockUnits]:
    """Heads and MLP neurons of every block of a supported timm ViT.

    Raises:
        UnsupportedModelError: naming the offending module and listing what is supported.
    """
    name = type(model).__name__
    if not isinstance(model, SUPPORTED_MODELS):
        reason = f": {REFUSED[name]}" if name in REFUSED else ""
        raise UnsupportedModelError(f"unsupported architecture {name}{reason}; supported {_supported_list()}")
    blocks = []
    for i, block in enumerate(model.blocks):
        kind = type(block).__name__
        if kind in REFUSED:
            raise UnsupportedModelError(f"block {i} ({kind}) is not supported: {REFUSED[kind]}; supported {_supported_list()}")
        attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
        if not isinstance(attn, SUPPORTED_ATTENTION) or not isinstance(mlp, SUPPORTED_MLP):
            raise UnsupportedModelError(
                f"block {i} ({kind}) has attn={type(attn).__name__}, mlp={type(mlp).__name__}; "
                f"supported {_supported_list()}"
            )
        blocks.append(BlockUnits(i, attention_units(attn, i), mlp_units(mlp)))
    return blocks


@dataclass
class Subnet:
    """Kept unit indices per block: which heads and which MLP neurons survive.

    Args:
        heads: per block, a sorted 1-D LongTensor of kept head indices.
        neurons: per block, a sorted 1-D LongTensor of kept hidden-neuron indices.
    """

    heads: list[torch.Tensor]
    neurons: list[torch.Tensor]

    @classmethod
    def full(cls, model_or_blocks: nn.Module | Sequence[BlockUnits]) -> "Subnet":
        """The subnet that keeps every unit."""
        blocks = _blocks(model_or_blocks)
        return cls([torch.arange(b.heads.num_units) for b in blocks], [torch.arange(b.neurons.num_units) for b in blocks])

    @classmethod
    def from_counts(cls, head_counts: Sequence[int], neuron_counts: Sequence[int]) -> "Subnet":
        """The subnet keeping the first ``k`` units of each block (used to rebuild saved shapes)."""
        return cls([torch.arange(int(k)) for k in head_counts], [torch.arange(int(k)) for k in neuron_counts])

    @property
    def head_counts(self) -> list[int]:
        return [len(h) for h in self.heads]

    @property
    def neuron_counts(self) -> list[int]:
        return [len(n) for n in self.neurons]

    def validate(self, model_or_blocks: nn.Module | Sequence[BlockUnits]) -> "Subnet":
        """Check the selection against a model; return a copy with sorted, CPU LongTensor indices.

        Raises:
            PruningSpecError: wrong number of blocks, an index out of range or repeated,
                or a block left with no head or no neuron.
        """
        blocks = _blocks(model_or_blocks)
        if len(self.heads) != len(blocks) or len(self.neurons) != len(blocks):
            raise PruningSpecError(
                f"selection covers {len(self.heads)} attention / {len(self.neurons)} MLP blocks but the model has "
                f"{len(blocks)} blocks; give one entry per block"
            )
        heads = [_check_indices(h, b.heads.num_units, f"block {b.index} heads") for h, b in zip(self.heads, blocks)]
        neurons = [_check_indices(n, b.neurons.num_units, f"block {b.index} MLP neurons") for n, b in zip(self.neurons, blocks)]
        return Subnet(heads, neurons)

    def to_dict(self) -> dict:
        return {"heads": [h.tolist() for h in self.heads], "neurons": [n.tolist() for n in self.neurons]}


def _blocks(model_or_blocks: nn.Module | Sequence[BlockUnits]) -> Sequence[BlockUnits]:
    return prunable_blocks(model_or_blocks) if isinstance(model_or_blocks, nn.Module) else model_or_blocks


def _check_indices(indices, num_units: int, what: str) -> torch.Tensor:
    idx = torch.as_tensor(indices, dtype=torch.long).flatten().cpu()
    if idx.numel() == 0:
        raise PruningSpecError(
            f"{what}: every unit would be removed; keep at least one (use a minimum keep ratio or a lower prune ratio)"
        )
    if int(idx.min()) < 0 or int(idx.max()) >= num_units:
        raise PruningSpecError(f"{what}: index out of range [0, {num_units}): got {idx.tolist()}")
    idx = torch.sort(idx).values
    if bool((idx[1:] == idx[:-1]).any()):
        raise PruningSpecError(f"{what}: repeated indices in {idx.tolist()}; each unit may be kept once")
    return idx


def iter_slots(group: UnitGroup) -> Iterator[tuple[Slot, torch.Tensor]]:
    """(slot, tensor) pairs of a unit group."""
    for slot, (holder, name) in zip(group.slots, group.holders):
        yield slot, getattr(holder, name)


#: Share of each block's MLP neurons / heads that is never pruned (the paper's): the defaults everywhere
#: (``importance.min_mlp_keep`` / ``min_head_keep``, the ranking, the budgets, the scorers that need them). Defined
#: here, below every layer that uses them (re-exported by :mod:`snapvit_pl.elastic`).
MIN_MLP_KEEP = 0.05
MIN_HEAD_KEEP = 0.2


def min_kept(num_units: int, min_keep_ratio: float) -> int:
    """Units of a block that are never pruned: ceil(ratio * n), at least 1."""
    return max(1, math.ceil(min_keep_ratio * num_units - 1e-9))
