"""Latency budgets: a per-block lookup table measured once on the target device, then any sub-network predicted.

Fewer FLOPs do not by themselves mean lower latency (small matrices run below peak, the unpruned
parts stay). So a latency budget is resolved on measured numbers: for every distinct block shape,
the block is timed on its real input shape with 1..H heads (full MLP) and with a few MLP widths
(all heads), physically pruned. A sub-network's latency is predicted as

    latency = overhead + sum over blocks of [ T(h_b, N) + T(H, n_b) - T(H, N) ]

where ``T(h, n)`` is the block's time with ``h`` heads and ``n`` neurons (interpolated linearly in
``n`` between the sampled widths, made non-decreasing in both), and ``overhead`` is the dense
model's measured time minus its blocks' (patch embedding, final norm, head). The table is saved
as JSON and reused for the same architecture, device and batch size.
"""
from __future__ import annotations

import copy
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from ..device import autocast_context, resolve_device, synchronize
from ..errors import CheckpointError, field_error
from ..io import check_version, verify_checksum, with_checksum, write_json_atomic
from ..models.cost import input_shape
from ..models.modes import eval_mode
from ..models.surgery import architecture, prune_block_
from ..models.tokens import block_kwargs, embed_tokens
from ..models.units import Subnet

FORMAT = "snapvit-pl/latency-table"
#: The table format's version (:func:`snapvit_pl.io.check_version`).
VERSION = 1
#: Bounds of a table's sizes (a sanity check before any field is used).
MAX_BLOCKS, MAX_UNITS, MAX_BATCH = 1024, 1 << 20, 1 << 20


@dataclass
class BlockLatency:
    """Measured milliseconds of one block shape: by kept heads (full MLP) and by kept MLP width (all heads)."""

    heads_ms: dict[int, float]
    mlp_ms: dict[int, float]

    def __post_init__(self) -> None:  # keys from JSON are strings; latency must not fall with more units
        self.heads_ms = _non_decreasing({int(k): float(v) for k, v in self.heads_ms.items()})
        self.mlp_ms = _non_decreasing({int(k): float(v) for k, v in self.mlp_ms.items()})

    @property
    def dense_ms(self) -> float:
        """The whole block: measured twice (all heads; the full MLP width), so the mean of both."""
        return (self.heads_ms[max(self.heads_ms)] + self.mlp_ms[max(self.mlp_ms)]) / 2

    def predict(self, heads: int, neurons: int) -> float:
        # (never below zero: on a noisy machine the two savings measured apart can add up to more than the block)
        return max(0.0, self.heads_ms[heads] + _interpolate(self.mlp_ms, neurons) - self.dense_ms)


@dataclass
class LatencyTable:
    """A model's latency lookup table on one device at one batch size (milliseconds per batch).

    Attributes:
        device: the device it was measured on (``cpu``, ``cuda``, ``cuda:1``).
        device_name: what that device is (the GPU's name; ``cpu``).
        batch_size: images per forward.
        precision: ``auto`` (bf16 autocast on CUDA, fp32 elsewhere), as the evaluation.
        architecture: heads and MLP width per block of the dense model (the table's key).
        overhead_ms: everything but the blocks.
        dense_ms: the whole dense model, measured.
        shapes: one :class:`BlockLatency` per distinct block shape; ``block_shape[b]`` indexes it.
        threads: torch CPU threads during the measurement.
    """

    device: str
    device_name: str
    batch_size: int
    precision: str
    architecture: dict[str, list[int]]
    overhead_ms: float
    dense_ms: float
    shapes: list[BlockLatency]
    block_shape: list[int]
    threads: int = 1
    format: str = FORMAT
    version: int = VERSION

    def predict(self, subnet: Subnet) -> float:
        """Predicted milliseconds per batch of ``subnet``."""
        return self.overhead_ms + sum(self.shapes[s].predict(h, n) for s, h, n in
                                      zip(self.block_shape, subnet.head_counts, subnet.neuron_counts))

    def matches(self, model: nn.Module, device: str | torch.device, batch_size: int, precision: str = "auto") -> bool:
        """Measured for this architecture, device, batch size and precision?"""
        return (self.architecture == architecture(model) and self.device == str(torch.device(device))
                and self.batch_size == batch_size and self.precision == precision)

    def save(self, path: str | Path) -> Path:
        """Write the table as JSON, with a checksum of its content (verified by :meth:`load`)."""
        return write_json_atomic(path, with_checksum(asdict(self)))

    @classmethod
    def load(cls, path: str | Path) -> "LatencyTable":
        """Read a table written by :meth:`save`; ``CheckpointError`` if unreadable, damaged or edited."""
        fix = "delete it to measure again"
        try:
            data = json.loads(Path(path).read_text())
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f"format is not {FORMAT!r}")
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{path} is not a readable latency table ({err}); {fix}") from err
        except RecursionError:
            raise CheckpointError(f"{path} is not a readable latency table (nested too deeply); {fix}") from None
        check_version(data.get("version"), VERSION, path, fix)
        data = verify_checksum(data, path, fix)
        check_table(data, path)
        data["shapes"] = [BlockLatency(**s) for s in data["shapes"]]
        return cls(**data)


def check_table(data: dict, path: str | Path) -> None:
    """The schema of a latency table's JSON: its fields and kinds, sizes within bounds, finite non-negative
    milliseconds, one shape index per block, and for every shape the timings a prediction reads (each head count
    1..H of the blocks of that shape; the MLP widths 1 and N); one :class:`CheckpointError` naming the file and
    the field."""
    def refuse(field: str, found, allowed: str) -> None:
        raise field_error(path, field, found, allowed, "delete it to measure again")

    def count(value, low: int, high: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high

    def ms(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0

    expected = {f.name for f in LatencyTable.__dataclass_fields__.values()}
    if set(data) != expected:
        refuse("fields", sorted(set(data) ^ expected), f"exactly {', '.join(sorted(expected))}")
    for key in ("device", "device_name", "precision"):
        if not isinstance(data[key], str) or not 0 < len(data[key]) <= 200:
            refuse(key, data[key], "a short text")
    for key, high in (("batch_size", MAX_BATCH), ("threads", 1 << 16)):
        if not count(data[key], 1, high):
            refuse(key, data[key], f"an integer in [1, {high}]")
    if not ms(data["overhead_ms"]):
        refuse("overhead_ms", data["overhead_ms"], "a finite number >= 0")
    if not ms(data["dense_ms"]) or data["dense_ms"] == 0:
        refuse("dense_ms", data["dense_ms"], "a finite number > 0")
    arch = data["architecture"]
    if not isinstance(arch, dict) or set(arch) != {"heads", "mlp_hidden"} or not all(
            isinstance(arch[k], list) and 1 <= len(arch[k]) <= MAX_BLOCKS and all(count(w, 1, MAX_UNITS) for w in arch[k])
            for k in arch) or len(arch["heads"]) != len(arch["mlp_hidden"]):
        refuse("architecture", arch, f"heads and mlp_hidden: 1 to {MAX_BLOCKS} positive integers each, one per block")
    shapes, block_shape = data["shapes"], data["block_shape"]
    if not isinstance(shapes, list) or not 1 <= len(shapes) <= len(arch["heads"]):
        refuse("shapes", shapes, "a list of block shapes, at most one per block")
    if not isinstance(block_shape, list) or len(block_shape) != len(arch["heads"]) or not all(
            count(s, 0, len(shapes) - 1) for s in block_shape) or set(block_shape) != set(range(len(shapes))):
        refuse("block_shape", block_shape, f"one index into shapes per block ({len(arch['heads'])}), each shape used")
    for index, shape in enumerate(shapes):
        if not isinstance(shape, dict) or set(shape) != {"heads_ms", "mlp_ms"}:
            refuse(f"shapes.{index}", shape, "heads_ms and mlp_ms")
        blocks = [b for b, s in enumerate(block_shape) if s == index]
        heads = {arch["heads"][b] for b in blocks}
        widths = {arch["mlp_hidden"][b] for b in blocks}
        for key, needed in (("heads_ms", set(range(1, max(heads) + 1))), ("mlp_ms", {1, max(widths)})):
            table = shape[key]
            if not isinstance(table, dict) or not table or not all(
                    isinstance(k, str) and k.isdigit() and count(int(k), 1, MAX_UNITS) and ms(v)
                    for k, v in table.items()) or not needed <= {int(k) for k in table} or len(heads) > 1 \
                    or len(widths) > 1:
                refuse(f"shapes.{index}.{key}", table, f"finite milliseconds >= 0 by unit count, {min(needed)} to "
                       f"{max(needed)} among them, for blocks of one shape")


def _non_decreasing(table: dict[int, float]) -> dict[int, float]:
    """The closest non-decreasing table (least squares, pool-adjacent-violators): timing noise must not make a
    wider block look faster."""
    keys = sorted(table)
    blocks = [[table[k], 1] for k in keys]  # [mean, count] of pooled runs
    merged: list[list[float]] = []
    for block in blocks:
        merged.append(block)
        while len(merged) > 1 and merged[-2][0] > merged[-1][0]:
            (m1, c1), (m2, c2) = merged[-2], merged.pop()
            merged[-1] = [(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2]
    values = [m for m, c in merged for _ in range(int(c))]
    return dict(zip(keys, values))


def _interpolate(table: dict[int, float], x: int) -> float:
    keys = sorted(table)
    if x <= keys[0]:
        return table[keys[0]]
    for a, b in zip(keys, keys[1:]):
        if x <= b:
            return table[a] + (table[b] - table[a]) * (x - a) / (b - a)
    return table[keys[-1]]


def time_rounds(functions: list, warmup: int, repeats: int, device: torch.device) -> list[float]:
    """Median milliseconds of each function, timed in interleaved rounds (a rotated order each round), so that a
    drifting machine load spreads over all of them instead of biasing some."""
    for fn in functions:
        for _ in range(warmup):
            fn()
    synchronize(device)
    times: list[list[float]] = [[] for _ in functions]
    for r in range(repeats):
        for i in [(r + k) % len(functions) for k in range(len(functions))]:
            start = time.perf_counter()
            functions[i]()
            synchronize(device)
            times[i].append(time.perf_counter() - start)
    return [1000 * statistics.median(t) for t in times]


def _block_signature(block: nn.Module) -> tuple:
    heads, mlp = prunable_blocks_of(block)
    return type(block).__name__, type(block.attn).__name__, type(block.mlp).__name__, heads, mlp, \
        tuple(p.shape for p in block.parameters())


def prunable_blocks_of(block: nn.Module) -> tuple[int, int]:
    from ..models.units import attention_units, mlp_units

    return attention_units(block.attn).num_units, mlp_units(block.mlp).num_units


def mlp_widths(width: int, points: int = 8, multiple: int = 1) -> list[int]:
    """The MLP widths sampled: ``points`` evenly spaced from ``width / points`` to ``width`` (rounded to ``multiple``)."""
    widths = {max(multiple, multiple * round(width * (i + 1) / points / multiple)) for i in range(points)}
    return sorted(min(w, width) for w in widths | {1, width})


@torch.inference_mode()
def measure_latency_table(
    model: nn.Module,
    batch_size: int,
    device: str | torch.device | None = None,
    precision: str = "auto",
    mlp_points: int = 8,
    mlp_multiple: int = 1,
    warmup: int = 3,
    repeats: int = 10,
) -> LatencyTable:
    """Time ``model``'s blocks at every head count and at ``mlp_points`` MLP widths, and the whole model.

    Args:
        model: the dense base model (not modified; pruned copies of single blocks are timed).
        batch_size: images per forward.
        device: where to measure (default: CUDA if available).
        precision: as :func:`snapvit_pl.device.autocast_context`.
        mlp_points: MLP widths sampled per block shape (interpolated in between).
        mlp_multiple: round the sampled widths to this multiple (as ``export.mlp_multiple``).
        warmup, repeats: untimed and timed forwards per measurement (the median is kept).
    """
    device = resolve_device(device)
    model = model.to(device)
    images = torch.randn(batch_size, *input_shape(model), device=device)
    signatures: dict[tuple, int] = {}
    block_shape, variants = [], []  # variants: (shape index, "heads"/"mlp", count, forward)
    with eval_mode(model), autocast_context(device, precision):
        tokens, rope = embed_tokens(model, images)
        for b, block in enumerate(model.blocks):
            signature = _block_signature(block)
            if signature not in signatures:
                signatures[signature] = len(signatures)
                heads, width = prunable_blocks_of(block)
                kwargs = block_kwargs(model, rope, b)
                for kind, counts in (("heads", range(1, heads + 1)), ("mlp", mlp_widths(width, mlp_points, mlp_multiple))):
                    for count in counts:
                        pruned = prune_block_(copy.deepcopy(block), count if kind == "heads" else heads,
                                              count if kind == "mlp" else width)
                        variants.append((signatures[signature], kind, count,
                                         lambda pruned=pruned, kwargs=kwargs: pruned(tokens, **kwargs)))
            block_shape.append(signatures[signature])
        ms = time_rounds([lambda: model(images)] + [v[3] for v in variants], warmup, repeats, device)
    dense_ms, measured = ms[0], ms[1:]
    tables: list[dict[str, dict[int, float]]] = [{"heads": {}, "mlp": {}} for _ in signatures]
    for (shape, kind, count, _), value in zip(variants, measured):
        tables[shape][kind][count] = value
    shapes = [BlockLatency(t["heads"], t["mlp"]) for t in tables]
    block_total = sum(shapes[s].dense_ms for s in block_shape)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return LatencyTable(str(device), name, batch_size, precision, architecture(model), max(0.0, dense_ms - block_total),
                        dense_ms, shapes, block_shape, torch.get_num_threads())


def latency_table(model: nn.Module, batch_size: int, device: str | torch.device | None = None,
                  cache: Optional[str | Path] = None, **options) -> LatencyTable:
    """The latency table of ``model``: read from ``cache`` when it was measured for this architecture, device and
    batch size, else measured (and written to ``cache``)."""
    device = resolve_device(device)
    if cache is not None and Path(cache).is_file():
        table = LatencyTable.load(cache)
        if table.matches(model, device, batch_size, options.get("precision", "auto")):
            return table
    table = measure_latency_table(model, batch_size, device, **options)
    if cache is not None:
        table.save(cache)
    return table

