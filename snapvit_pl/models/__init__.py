"""Model layer: loading timm ViTs, the uniform unit view, surgery, checkpoints and cost."""
from .checkpoint import load_pruned, read_record, save_pruned
from .cost import count_flops, count_params, flop_counts, input_shape
from .modes import eval_mode, manual_attention
from .embedding import embed
from .loading import BackboneSpec, fingerprint, load_backbone
from .surgery import architecture, prune_, use_subnet
from .units import BlockUnits, Slot, Subnet, UnitGroup, prunable_blocks

__all__ = [
    "BackboneSpec", "BlockUnits", "Slot", "Subnet", "UnitGroup", "architecture", "count_flops", "count_params",
    "embed", "eval_mode", "fingerprint", "flop_counts", "input_shape", "load_backbone", "load_pruned", "manual_attention", "prunable_blocks", "prune_",
    "read_record", "save_pruned", "use_subnet",
]
