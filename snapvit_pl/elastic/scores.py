"""The elastic artifact: local unit scores x learned block coefficients = one ranking for every budget.

Saved as a single safetensors file: the tensors (local scores, coefficients) plus a JSON header
(base-model identity and weight fingerprint, architecture, keep ratios, method settings, search
summary). No pickles; written atomically.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ..errors import CheckpointError, field_error
from ..io import CHECKSUM_KEY, atomic_path, check_version, content_digest, special_file, verify_checksum
from ..models.loading import UNREADABLE_CHECKPOINT, check_spec, fingerprint
from ..models.surgery import prune_
from ..errors import PruningSpecError
from ..models.units import Subnet, prunable_blocks
from .budget import Budget, CostModel, resolve
from .ranking import MIN_HEAD_KEEP, MIN_MLP_KEEP
from .splits import SplitTable

if TYPE_CHECKING:
    from .latency import LatencyTable

FORMAT = "snapvit-pl/elastic-scores"
VERSION = 3  # 3: a checksum of the tensors and the header; 2: splits by metric and kept fraction (1: by budget label)


def initial_coefficients(num_blocks: int, heads_per_block: Sequence[int], start: float, end: float) -> torch.Tensor:
    """The search's initial mean: ``linspace(start, end)`` over blocks, each head taking its block's value
    (``SearchSettings.initial_range``).

    Layout: ``[mlp_0 .. mlp_{B-1}, heads of block 0, heads of block 1, ...]`` (D = B + sum(heads)).
    """
    per_block = torch.linspace(start, end, num_blocks)
    return torch.cat([per_block] + [per_block[b].repeat(h) for b, h in enumerate(heads_per_block)])


def split_coefficients(vector: torch.Tensor, heads_per_block: Sequence[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Inverse layout of :func:`initial_coefficients`: ``(mlp [B], heads per block)``."""
    num_blocks = len(heads_per_block)
    expected = num_blocks + sum(heads_per_block)
    if vector.numel() != expected:
        raise CheckpointError(f"coefficient vector has {vector.numel()} entries, expected {expected} (B + total heads)")
    return vector[:num_blocks], list(torch.split(vector[num_blocks:], list(heads_per_block)))


@dataclass
class ElasticScores:
    """Local scores and cross-block coefficients of one base model.

    Args:
        head_scores: per block, local score of each head.
        neuron_scores: per block, local score of each MLP neuron.
        coefficients: ``[B + total heads]`` search result (see :func:`initial_coefficients`), or
            ``None`` for local scores only (all coefficients 1).
        base: ``BackboneSpec.to_dict()`` of the base model.
        fingerprint: :func:`snapvit_pl.models.fingerprint` of the base weights.
        min_mlp_keep: fraction of each block's neurons never pruned.
        min_head_keep: fraction of each block's heads never pruned.
        settings: method settings (scorer, search, the export's ``mlp_multiple``, ...), for the record.
        search: search summary (evaluations, best fitness, ...), for the record.
        splits: the head ratios chosen for parameter and FLOPs budgets (:class:`SplitTable`); a sparsity, params
            or FLOPs budget is cut at the head ratio recorded (or interpolated) for its kept fraction, any
            other budget along the default schedule.
    """

    head_scores: list[torch.Tensor]
    neuron_scores: list[torch.Tensor]
    coefficients: Optional[torch.Tensor] = None
    base: dict[str, Any] = field(default_factory=dict)
    fingerprint: str = ""
    min_mlp_keep: float = MIN_MLP_KEEP
    min_head_keep: float = MIN_HEAD_KEEP
    settings: dict[str, Any] = field(default_factory=dict)
    search: dict[str, Any] = field(default_factory=dict)
    splits: SplitTable = field(default_factory=SplitTable)

    def __post_init__(self) -> None:
        if not isinstance(self.splits, SplitTable):
            self.splits = SplitTable.from_dict(self.splits)

    def __repr__(self) -> str:
        """One line: what the scores cover, not every score (a ViT-B's are 37,008 numbers)."""
        name = self.base.get("model_name", "a model") if self.base else "a model"
        return (f"ElasticScores({name}: {len(self.head_scores)} blocks, {sum(self.heads_per_block)} heads, "
                f"{sum(len(n) for n in self.neuron_scores)} MLP neurons, coefficients "
                f"{'searched' if self.search else 'initial' if self.coefficients is not None else 'none'}, "
                f"{len(self.splits)} recorded splits)")

    def copy(self) -> "ElasticScores":
        """A copy whose tensors and records are its own (changing it leaves these scores as they are)."""
        import copy

        return copy.deepcopy(self)

    @property
    def mlp_multiple(self) -> int:
        """The MLP width rounding of the run that made these scores (1 when not recorded)."""
        return int((self.settings.get("export") or {}).get("mlp_multiple", 1))

    @property
    def heads_per_block(self) -> list[int]:
        return [len(h) for h in self.head_scores]

    def unified(self, coefficients: torch.Tensor | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Unit scores ``local * |coefficient|`` (heads per block, neurons per block)."""
        coefficients = self.coefficients if coefficients is None else coefficients
        if coefficients is None:
            return [h.float() for h in self.head_scores], [n.float() for n in self.neuron_scores]
        mlp, heads = split_coefficients(coefficients.detach().float().cpu(), self.heads_per_block)
        return (
            [s.float() * c.abs() for s, c in zip(self.head_scores, heads)],
            [s.float() * mlp[b].abs() for b, s in enumerate(self.neuron_scores)],
        )

    def split(self, budget: Budget, cost: CostModel | None) -> float | None:
        """The recorded (or interpolated) head ratio of a cost budget; None: the default schedule."""
        point = budget.cost_point(cost) if cost is not None else None
        return None if point is None else self.splits.head_ratio(*point)

    def subnet(
        self, budget: Budget, cost: CostModel | None = None, mlp_multiple: int | None = None,
        coefficients: torch.Tensor | None = None,
    ) -> tuple[Subnet, float, float]:
        """``(subnet, mlp_ratio, head_ratio)`` meeting ``budget`` (see :func:`.budget.resolve`); a cost budget is cut
        at the head ratio :meth:`split` gives (the schedule where that head ratio cannot meet it).

        Args:
            budget: the budget.
            cost: the base model's :class:`CostModel` (needed by cost budgets).
            mlp_multiple: round MLP widths to this multiple (default: the run's, :attr:`mlp_multiple`).
            coefficients: other coefficients than the recorded ones (the search's candidates).
        """
        heads, neurons = self.unified(coefficients)
        multiple = self.mlp_multiple if mlp_multiple is None else mlp_multiple
        keep = (self.min_mlp_keep, self.min_head_keep, multiple)
        head_ratio = self.split(budget, cost)
        if head_ratio is not None:
            try:
                return resolve(budget, heads, neurons, cost, *keep, head_ratio=head_ratio)
            except PruningSpecError:
                pass  # an interpolated head ratio that cannot meet this budget: the schedule decides
        return resolve(budget, heads, neurons, cost, *keep)

    def extract(
        self, model: nn.Module, budget: Budget | None = None, mlp_multiple: int | None = None, verify_fingerprint: bool = True,
        latency: "LatencyTable | None" = None, **budget_fields: float,
    ) -> nn.Module:
        """A physically pruned copy of ``model`` (the base these scores belong to) at a budget.

        Example: ``small = scores.extract(model, flops=0.5)``; the base model is left intact.

        Args:
            model: the dense base model.
            budget: a :class:`Budget`, or give its fields as keywords (``flops=0.5``, ``sparsity=0.4``, ...).
            mlp_multiple: round MLP widths to this multiple (8/16 for hardware-friendly shapes; default: the run's).
            verify_fingerprint: check that ``model`` holds the weights the scores were computed on.
            latency: the latency table of the target device, for ``latency=`` budgets
                (:func:`snapvit_pl.elastic.latency.latency_table`).
        """
        budget = Budget.parse(budget if budget is not None else budget_fields)
        self.check_model(model, verify_fingerprint)
        subnet = self.subnet(budget, CostModel(model, latency=latency), mlp_multiple)[0]
        return prune_(copy.deepcopy(model), subnet)

    def check_model(self, model: nn.Module, verify_fingerprint: bool = True) -> None:
        """Raise ``CheckpointError`` if ``model`` is not the base model these scores were computed for."""
        blocks = prunable_blocks(model)
        shape = ([b.heads.num_units for b in blocks], [b.neurons.num_units for b in blocks])
        if shape != (self.heads_per_block, [len(n) for n in self.neuron_scores]):
            raise CheckpointError(
                f"elastic scores are for {self.base.get('model_name', '?')} with heads {self.heads_per_block}, "
                f"but the model has heads {shape[0]} / MLP widths {shape[1]}; use the scores of this model or re-run prune.py"
            )
        if verify_fingerprint and self.fingerprint and fingerprint(model) != self.fingerprint:
            raise CheckpointError(
                f"elastic scores were computed for other weights of {self.base.get('model_name', '?')} "
                f"(fingerprint {self.fingerprint[:12]} != {fingerprint(model)[:12]}); load the same base weights or re-run prune.py"
            )

    def save(self, path: str | Path, overwrite: bool = True) -> Path:
        """Write one safetensors file atomically, with a checksum of its content (verified by :meth:`load`).

        Raises:
            ConfigError: ``path`` is a directory (nothing is written; the directory is left as it is).
        """
        tensors = {f"heads.{b}": t.float().cpu().contiguous() for b, t in enumerate(self.head_scores)}
        tensors |= {f"neurons.{b}": t.float().cpu().contiguous() for b, t in enumerate(self.neuron_scores)}
        if self.coefficients is not None:
            tensors["coefficients"] = self.coefficients.float().cpu().contiguous()
        header = {
            "format": FORMAT, "version": VERSION, "base": self.base, "fingerprint": self.fingerprint,
            "num_blocks": len(self.head_scores), "min_mlp_keep": self.min_mlp_keep, "min_head_keep": self.min_head_keep,
            "settings": self.settings, "search": self.search, "splits": self.splits.to_dict(),
        }
        # one metadata entry (safetensors orders several at random: the file would not be byte-identical)
        text = json.dumps({**header, CHECKSUM_KEY: content_digest({"header": header, "tensors": tensors})})
        size = sum(t.numel() * t.element_size() for t in tensors.values()) + len(text)
        with atomic_path(path, overwrite=overwrite, size=size) as tmp:
            save_file(tensors, str(tmp), metadata={"snapvit": text})
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> "ElasticScores":
        """Read a file written by :meth:`save`; ``CheckpointError`` if missing, corrupt or foreign."""
        path = Path(path)
        if not path.is_file():
            special = "a directory" if path.is_dir() else special_file(path)
            what = f"elastic scores file {path} is {special}, not a file" if special else \
                f"elastic scores file not found: {path}"
            raise CheckpointError(f"{what}; run prune first or pass the path of its elastic_scores.safetensors")
        fix = "re-run prune.py to rewrite it"
        try:
            with safe_open(str(path), framework="pt") as f:
                metadata = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            header = json.loads(metadata.get("snapvit", "null"))
        except (*UNREADABLE_CHECKPOINT, json.JSONDecodeError, RecursionError) as err:
            reason = "nested too deeply" if isinstance(err, RecursionError) else err
            raise CheckpointError(f"{path} is not a readable elastic-scores file ({reason}); {fix}") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise CheckpointError(f"{path} is not a snapvit-pl elastic-scores file (format != {FORMAT!r})")
        check_version(header.get("version"), VERSION, path, fix)
        recorded = {CHECKSUM_KEY: header.pop(CHECKSUM_KEY)} if CHECKSUM_KEY in header else {}
        verify_checksum({"header": header, "tensors": tensors, **recorded}, path, fix)
        check_header(header, tensors, path)
        n = header["num_blocks"]
        heads, neurons = [tensors[f"heads.{b}"] for b in range(n)], [tensors[f"neurons.{b}"] for b in range(n)]
        splits = SplitTable.from_dict(header.get("splits"))
        return cls(
            heads, neurons, tensors.get("coefficients"), header["base"], header["fingerprint"],
            header["min_mlp_keep"], header["min_head_keep"], header.get("settings", {}), header.get("search", {}), splits,
        )


#: The header fields of an elastic-scores file and their kinds (:func:`check_header`).
_HEADER_FIELDS = {"format": str, "version": int, "base": (dict, type(None)), "fingerprint": (str, type(None)),
                  "num_blocks": int, "min_mlp_keep": (int, float), "min_head_keep": (int, float), "settings": dict,
                  "search": dict, "splits": dict}
MAX_BLOCKS = 1024


def check_header(header: dict[str, Any], tensors: dict[str, torch.Tensor], path: Path) -> None:
    """The schema of an elastic-scores file: the header's fields and kinds, the base model's spec, keep ratios in
    [0, 1], one finite 1-D score vector per block for heads and for neurons (and an optional 1-D coefficient
    vector), splits as (kept fraction, head ratio) pairs in [0, 1]; one :class:`CheckpointError` naming the file and
    the field."""
    def refuse(field: str, found: Any, allowed: str) -> None:
        raise field_error(path, field, found, allowed, "re-run prune.py to rewrite it")

    for key, kind in _HEADER_FIELDS.items():
        value = header.get(key)
        if key not in header or not isinstance(value, kind) or (isinstance(value, bool) and key != "format"):
            refuse(key, value, f"a {kind.__name__ if isinstance(kind, type) else ' or '.join(k.__name__ for k in kind)}")
    if header["base"]:
        check_spec(header["base"], str(path))
    n = header["num_blocks"]
    if not 1 <= n <= MAX_BLOCKS:
        refuse("num_blocks", n, f"an integer in [1, {MAX_BLOCKS}]")
    for key in ("min_mlp_keep", "min_head_keep"):
        if not 0 <= header[key] <= 1:
            refuse(key, header[key], "a number in [0, 1]")
    expected = {f"{kind}.{b}" for kind in ("heads", "neurons") for b in range(n)}
    if not expected <= set(tensors) or not set(tensors) <= expected | {"coefficients"}:
        refuse("tensors", sorted((set(tensors) ^ expected) - {"coefficients"})[:4],
               f"heads.0 .. heads.{n - 1} and neurons.0 .. neurons.{n - 1} (and coefficients)")
    for name, tensor in tensors.items():
        if tensor.ndim != 1 or not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            refuse(f"tensor {name}", f"{tensor.dtype} of shape {tuple(tensor.shape)}", "a finite 1-D float vector")
    for metric, pairs in header["splits"].items():
        if metric not in ("params", "flops") or not isinstance(pairs, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                           and 0 <= v <= 1 for v in p) for p in pairs):
            refuse(f"splits.{metric}", pairs, "params / flops: [kept fraction, head ratio] pairs in [0, 1]")
