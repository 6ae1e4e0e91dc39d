"""Pruned checkpoints: safetensors weights + a JSON architecture record, no pickled code.

A checkpoint is a directory::

    <name>/model.safetensors   the pruned model's state dict
    <name>/architecture.json   how to build the base timm model, and heads / MLP width per block

:func:`load_pruned` rebuilds the model from timm with the base architecture (no weights
fetched), cuts it to the recorded shapes and loads the weights. Only timm, safetensors and this
module are needed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..device import resolve_device
from ..errors import CheckpointError, ConfigError, SnapViTError, field_error
from ..io import atomic_path, check_version, sha256_file, verify_checksum, with_checksum
from .hub import CHECKPOINT_FILES, download_pruned
from .loading import HUB_PREFIX, UNREADABLE_CHECKPOINT, BackboneSpec, check_finite, check_spec, load_backbone
from .surgery import architecture, prune_
from .units import Subnet

FORMAT = "snapvit-pl/pruned-vit"
VERSION = 2  # 2: the record carries its own checksum (1: only the weights' checksum)
WEIGHTS, RECORD = CHECKPOINT_FILES
#: What a pruned-checkpoint directory may hold (the model card of a published one included).
CHECKPOINT_CONTENTS = {WEIGHTS, RECORD, "README.md"}


def is_checkpoint_dir(path: str | Path) -> bool:
    """Whether ``path`` is an (empty or) pruned-checkpoint directory and nothing else: the only kind of
    directory :func:`save_pruned` replaces."""
    names = {p.name for p in Path(path).iterdir()}
    return not names or (RECORD in names and names <= CHECKPOINT_CONTENTS)


def save_pruned(
    model: nn.Module,
    path: str | Path,
    base: BackboneSpec,
    subnet: Subnet | None = None,
    extra: dict[str, Any] | None = None,
    overwrite: bool = True,
) -> Path:
    """Save a (physically) pruned model as ``path/model.safetensors`` + ``path/architecture.json``.

    Args:
        model: the pruned timm model.
        path: output directory, written atomically.
        base: the spec of the unpruned model it was cut from (its weights are not needed to load).
        subnet: kept unit indices relative to the base model, recorded for traceability.
        extra: JSON-serialisable metadata (ratios, params, FLOPs, base fingerprint, ...).
        overwrite: replace an existing checkpoint at ``path``.
    """
    record = {
        "format": FORMAT,
        "version": VERSION,
        "base": base.architecture_only().to_dict(),
        **architecture(model),
        "kept_heads": [h.tolist() for h in subnet.heads] if subnet is not None else None,
        "extra": extra or {},
    }
    try:
        json.dumps(record)
    except TypeError as err:
        raise CheckpointError(f"architecture record is not JSON-serialisable ({err}); pass plain values in extra/model_kwargs") from err
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    size = sum(t.numel() * t.element_size() for t in state.values())
    with atomic_path(path, overwrite=overwrite, replaces=is_checkpoint_dir, size=size) as tmp:
        tmp.mkdir()
        save_file(state, str(tmp / WEIGHTS), metadata={"format": FORMAT})
        record["weights_sha256"] = sha256_file(tmp / WEIGHTS)
        (tmp / RECORD).write_text(json.dumps(with_checksum(record), indent=2) + "\n")
    return Path(path)


def read_record(path: str | Path) -> dict[str, Any]:
    """Read and check ``architecture.json`` of a pruned checkpoint directory."""
    record_path = Path(path) / RECORD
    if Path(path).is_file():
        raise CheckpointError(f"{path} is a file; a pruned checkpoint is the directory holding {WEIGHTS} and {RECORD} "
                              "(give its directory)")
    if not record_path.is_file():
        raise CheckpointError(
            f"{record_path} not found; a pruned checkpoint is a directory with {WEIGHTS} and {RECORD} "
            "(written by prune.py / save_pruned)"
        )
    try:
        record = json.loads(record_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise CheckpointError(f"{record_path} is not valid JSON ({reason}); re-export the checkpoint") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError(f"{record_path} is not a snapvit-pl pruned-model record (format != {FORMAT!r})")
    check_version(record.get("version"), VERSION, record_path, "re-export the checkpoint from its elastic scores "
                  "(snapvit-pl extract)")
    record = verify_checksum(record, record_path, "re-export the checkpoint")
    check_record(record, record_path)
    return record


#: Bounds of a record's per-block widths (a sanity check before any model is built).
MAX_BLOCKS, MAX_HEADS, MAX_MLP_HIDDEN = 1024, 1024, 1 << 20


def check_record(record: dict[str, Any], source: Path) -> None:
    """The schema of ``architecture.json``: the base model's spec (:func:`snapvit_pl.models.loading.check_spec`),
    ``heads`` and ``mlp_hidden`` as one non-negative integer per block, ``kept_heads`` (optional) as distinct head
    indices per block, ``weights_sha256`` a digest; one :class:`CheckpointError` naming the file and the field."""
    def refuse(field: str, found: Any, allowed: str) -> None:
        raise field_error(source, field, found, allowed, "re-export the checkpoint")

    for key in ("base", "heads", "mlp_hidden", "weights_sha256"):
        if key not in record:
            raise CheckpointError(f"{source} lacks '{key}'; re-export the checkpoint")
    check_spec(record["base"], str(source))
    blocks = None
    for key, high in (("heads", MAX_HEADS), ("mlp_hidden", MAX_MLP_HIDDEN)):
        widths = record[key]
        if not isinstance(widths, list) or not 1 <= len(widths) <= MAX_BLOCKS or not all(
                _is_int(w) and 0 <= w <= high for w in widths):
            refuse(key, widths, f"a list of 1 to {MAX_BLOCKS} integers in [0, {high}], one per block")
        if blocks is not None and len(widths) != blocks:
            refuse(key, widths, f"{blocks} entries, one per block (as heads)")
        blocks = len(widths)
    kept = record.get("kept_heads")
    if kept is not None and (not isinstance(kept, list) or len(kept) != blocks or not all(
            isinstance(b, list) and len(b) == n and len(set(map(str, b))) == n and all(_is_int(i) and 0 <= i < MAX_HEADS
                                                                                    for i in b)
            for b, n in zip(kept, record["heads"]))):
        refuse("kept_heads", kept, "per block, the distinct indices of its kept heads (as many as heads says)")
    digest = record["weights_sha256"]
    if not isinstance(digest, str) or len(digest) != 64:
        refuse("weights_sha256", digest, "the weights file's sha256 (64 hex digits)")
    extra = record.get("extra", {})
    if not isinstance(extra, dict):
        refuse("extra", extra, "a mapping")
    for key, (valid, allowed) in EXTRA_FIELDS.items():
        if extra.get(key) is not None and not valid(extra[key]):
            refuse(f"extra.{key}", extra[key], allowed)
    if isinstance(extra.get("base_spec"), dict):
        check_spec(extra["base_spec"], f"{source}: extra.base_spec")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_fraction(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1


#: The fields of a record's ``extra`` that readers use (the model card, fine-tuning, the report): their kinds, each
#: checked when present (``extra`` may hold other fields).
EXTRA_FIELDS = {
    "label": (lambda v: isinstance(v, str), "a string"),
    "budget": (lambda v: isinstance(v, dict), "a mapping"),
    **{key: (_is_fraction, "a number in [0, 1]") for key in ("mlp_ratio", "head_ratio", "requested_mlp_ratio",
                                                            "requested_head_ratio")},
    **{key: (lambda v: _is_int(v) and v >= 0, "a non-negative integer") for key in ("params", "flops", "macs")},
    **{key: (lambda v: isinstance(v, list) and all(_is_int(w) and w >= 0 for w in v), "a list of non-negative integers")
       for key in ("heads", "mlp_hidden")},
    "metrics": (lambda v: isinstance(v, dict), "a mapping of metric names to values"),
    "evaluated_on": (lambda v: isinstance(v, dict) and isinstance(v.get("dataset", ""), (str, type(None))),
                     "a mapping (dataset: a name)"),
    "base_spec": (lambda v: isinstance(v, dict), "a mapping (the base model's spec)"),
    "base_fingerprint": (lambda v: isinstance(v, str), "a string"),
}


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check a pruned checkpoint directory without loading the model: its record (and the record's checksum) and
    its weights file against the checksum recorded; returns the record.

    Raises:
        CheckpointError: a missing, damaged or modified file.
    """
    path = Path(path)
    record = read_record(path)
    weights = path / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{weights} not found; the checkpoint directory is incomplete, re-export it")
    if sha256_file(weights) != record["weights_sha256"]:
        raise CheckpointError(
            f"{weights} does not match the checksum in {path / RECORD} (truncated, modified or from another run); "
            "re-export the checkpoint"
        )
    return record


def load_pruned(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild a pruned model from timm + its architecture record, then load its weights.

    Args:
        path: a checkpoint directory, or ``hf-hub:org/name[@revision]`` for one on the Hugging Face Hub
            (downloaded through ``huggingface_hub``, which honours its cache and ``HF_HUB_OFFLINE``).
        map_location: the device the weights are loaded to.

    Returns:
        ``(model, record)`` with the model in eval mode.

    Raises:
        CheckpointError: missing or corrupt files, a record that does not fit its base model,
            or weights that do not match the record.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"path must be a checkpoint directory or 'hf-hub:org/name', got {type(path).__name__}")
    try:
        device = resolve_device("cpu" if map_location is None else map_location)
    except (RuntimeError, TypeError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"map_location {map_location!r} is not a device; give 'cpu', 'cuda', 'cuda:1' or a "
                          "torch.device") from None
    if isinstance(path, str) and path.startswith(HUB_PREFIX):
        path = download_pruned(path)
    path = Path(path)
    record = verify_checkpoint(path)
    weights = path / WEIGHTS
    try:
        model = load_backbone(BackboneSpec.from_dict(record["base"], str(path / RECORD)).architecture_only())
    except ConfigError as err:  # the recorded base, not a user's setting: the record is what to fix
        raise CheckpointError(f"{path / RECORD}: its base model cannot be built ({err}); re-export the "
                              "checkpoint") from None
    try:
        prune_(model, Subnet.from_counts(record["heads"], record["mlp_hidden"]))
    except SnapViTError as err:
        raise CheckpointError(
            f"{path / RECORD} does not fit its base model {record['base']['model_name']}: {err}; "
            "the record was edited or written for another architecture"
        ) from err
    try:
        state = load_file(str(weights), device=str(device))
        model.load_state_dict(state, strict=True)
    except UNREADABLE_CHECKPOINT as err:
        raise CheckpointError(
            f"weights {weights} do not match record {path / RECORD}: {' '.join(str(err).split())[:400]}"
        ) from err
    check_finite(model, path)
    return model.eval(), record
