"""The scorer interface, the per-block score container, batch parsing and the per-unit weight rows.

Every scorer turns a model (and, for most, some data) into one importance score per attention
head and per MLP hidden neuron of every block; higher means more important. The life cycle is
the same for all of them, so one loop drives any of them (:class:`snapvit_pl.pipeline.importance.ImportancePass`: the
pipeline, its Lightning callback and ``local_importance`` share it)::

    scorer = spec.bind(model, context)   # every process: an accumulator bound to the model
    for p in range(scorer.passes):       # one pass for most scorers
        for batch in loader:             # skipped when not scorer.requires_data
            scorer.update(batch)
        scorer.reduce(all_reduce_sum)    # once per pass; identity on a single process
        if p + 1 < scorer.passes:
            scorer.next_pass()
    scores = scorer.compute()            # LocalScores

A scorer object made by its constructor is a *specification*: its arguments (what a YAML's ``class_path`` /
``init_args`` name, plain and picklable), frozen once the constructor returns, so no statistics can sit on it.
:meth:`Scorer.bind` returns an *accumulator*: a copy of the specification, of the class's accumulator type (a
subclass of the scorer's class and of :class:`Accumulator`, made once per class), bound to the model with what the run
hands over (:class:`ScoringContext`: keep ratios, the data's global views and batch size, a teacher); ``update``,
``reduce``, ``next_pass``, ``compute`` and a state's loading work on an accumulator only. A class that names itself
(``name``) registers under that name as it is defined (:attr:`Scorer.registry`). The accumulators are sums over
samples, all-reduced in place across processes (:meth:`SummedStatistics.reduce`), never gathered; an accumulator is
dropped once the scores exist. (``torchmetrics.Metric`` was weighed for this and not taken: ``add_state`` deep-copies
each default tensor and its synchronisation gathers every process's copy before summing, world-size times a state that
is gigabytes for the Gauss-Newton Gram: docs/development.md.)
"""
from __future__ import annotations

import copy
import inspect
from abc import ABCMeta, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Optional, Sequence

import torch
from torch import Tensor, nn

from ..errors import CheckpointError, ConfigError, DataError, SnapViTError
from ..models.units import MIN_HEAD_KEEP, MIN_MLP_KEEP, BlockUnits, UnitGroup, prunable_blocks
from ..ranges import one_of


class ScoringError(SnapViTError, ValueError):
    """A scorer is misconfigured or used out of order (unknown name, bad argument, no data)."""


class NonFiniteGradientError(SnapViTError, FloatingPointError):
    """A scoring gradient contained NaN or inf."""


# -- scores ------------------------------------------------------------------------------------
#: How unit scores of different blocks are compared by the global ranking (``importance.allocation``):
#: ``global``, the scores as they are (calibrated across blocks: the project's default score, SnapViT's scores with
#: their block coefficients); ``uniform``, every block loses the same share (what Minitron and Wanda-sp publish);
#: ``standardized``, per-block z-scores (FLAP's standardisation).
ALLOCATIONS = ("global", "uniform", "standardized")
Allocation = one_of(*ALLOCATIONS)


def _within_block_rank(scores: Tensor) -> Tensor:
    """Rank of each score within its block as a fraction in [0, 1] (ties by position, stable)."""
    order = torch.argsort(scores, stable=True)
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(len(scores), dtype=scores.dtype)
    return ranks / max(1, len(scores) - 1)


def _standardized(scores: Tensor) -> Tensor:
    """Per-block z-scores (a block with constant scores gets zeros)."""
    std = scores.std(unbiased=False) if len(scores) > 1 else scores.new_tensor(0.0)
    return (scores - scores.mean()) / std if std > 0 else torch.zeros_like(scores)


@dataclass
class LocalScores:
    """One importance score per unit (higher = more important), block by block.

    Args:
        heads: per block, ``[num_heads]`` float32 CPU tensor.
        neurons: per block, ``[mlp_hidden]`` float32 CPU tensor.
    """

    heads: list[Tensor]
    neurons: list[Tensor]

    def __post_init__(self):
        self.heads = [torch.as_tensor(h, dtype=torch.float32).detach().flatten().cpu() for h in self.heads]
        self.neurons = [torch.as_tensor(n, dtype=torch.float32).detach().flatten().cpu() for n in self.neurons]

    @property
    def num_blocks(self) -> int:
        return len(self.heads)

    def to_dict(self) -> dict[str, list[list[float]]]:
        """Plain nested lists (JSON/YAML-ready)."""
        return {"heads": [h.tolist() for h in self.heads], "neurons": [n.tolist() for n in self.neurons]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LocalScores":
        """Inverse of :meth:`to_dict`; also accepts lists of tensors.

        Raises:
            CheckpointError: ``heads`` or ``neurons`` is missing.
        """
        if not isinstance(data, dict) or "heads" not in data or "neurons" not in data:
            raise CheckpointError("scores must be a mapping with 'heads' and 'neurons' (one list per block)")
        return cls(list(data["heads"]), list(data["neurons"]))

    def allocated(self, allocation: Allocation) -> "LocalScores":
        """The scores as the global ranking should compare them across blocks (see :data:`ALLOCATIONS`).

        ``global`` returns self; ``uniform`` replaces each score by its rank within its block, as a fraction in
        [0, 1], so a global cut removes (to one unit) the same share of every block; ``standardized`` subtracts each
        block's mean and divides by its standard deviation (FLAP), separately for heads and MLP neurons.
        """
        if allocation not in ALLOCATIONS:
            raise ConfigError(f"importance.allocation must be one of {', '.join(ALLOCATIONS)}, got {allocation!r}")
        if allocation == "global":
            return self
        transform = _within_block_rank if allocation == "uniform" else _standardized
        return LocalScores([transform(h) for h in self.heads], [transform(n) for n in self.neurons])

    def validate(self, model_or_blocks: nn.Module | Sequence[BlockUnits], scorer: Optional[str] = None
                 ) -> "LocalScores":
        """Check the scores fit a model (block count, units per block, finite values); returns self.

        Args:
            model_or_blocks: the model the scores are for (or its :func:`prunable_blocks`).
            scorer: the name of the scorer that just computed them (the refusal names it and says what a scorer
                must return); None: scores read from a file.

        Raises:
            ScoringError: (``scorer`` given) naming the scorer, the unit kind, the block and the first bad index.
            CheckpointError: (scores read from a file) naming the first mismatch.
        """
        blocks = prunable_blocks(model_or_blocks) if isinstance(model_or_blocks, nn.Module) else model_or_blocks
        problem = self._first_problem(blocks)
        if problem is None:
            return self
        if scorer is not None:
            raise ScoringError(f"the {scorer} scorer computed {problem}: a scorer returns one finite score per head "
                               "and per MLP neuron of every block (LocalScores)")
        raise CheckpointError(f"{problem}; these scores belong to another model or are damaged")

    def _first_problem(self, blocks: Sequence[BlockUnits]) -> Optional[str]:
        if len(self.heads) != len(blocks) or len(self.neurons) != len(blocks):
            return (f"scores for {len(self.heads)} attention / {len(self.neurons)} MLP blocks, but the model has "
                    f"{len(blocks)} blocks")
        for block, h, n in zip(blocks, self.heads, self.neurons):
            for what, scores, group in (("heads", h, block.heads), ("MLP neurons", n, block.neurons)):
                if scores.numel() != group.num_units:
                    return f"{scores.numel()} scores for block {block.index}'s {group.num_units} {what}"
                bad = (~torch.isfinite(scores)).nonzero().flatten()
                if bad.numel():
                    first = int(bad[0])
                    return (f"a non-finite score ({float(scores[first])}) for block {block.index}'s {what[:-1]} "
                            f"{first}" + (f" (and {bad.numel() - 1} more)" if bad.numel() > 1 else ""))
        return None


# -- the interface -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ScoringContext:
    """What a run hands a scorer besides the model, once, when it binds it (:meth:`Scorer.bind`).

    Args:
        teacher: a frozen copy of the model (the self-supervised scorers make one if None).
        min_mlp_keep: share of each block's MLP neurons the run never prunes (``importance.min_mlp_keep``).
        min_head_keep: share of each block's heads the run never prunes (``importance.min_head_keep``).
        global_views: the global crops per multi-crop sample the data makes (``data.init_args.n_global_views``: a
            self-distillation scorer's teacher inputs).
        batch_size: the pruning data's batch size (``data.init_args.batch_size``).
    """

    teacher: Optional[nn.Module] = None
    min_mlp_keep: float = MIN_MLP_KEEP
    min_head_keep: float = MIN_HEAD_KEEP
    global_views: Optional[int] = None
    batch_size: Optional[int] = None


class _Specification(ABCMeta):
    """The scorers' metaclass: an object a scorer class makes is frozen once its constructor returns."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        made = super().__call__(*args, **kwargs)
        object.__setattr__(made, "_frozen", True)
        return made


class Accumulator:
    """What every accumulator type derives from besides its scorer's class (``isinstance(x, Accumulator)``: bound to
    a model, holding statistics): :meth:`Scorer.bind` makes them."""


class Scorer(metaclass=_Specification):
    """Base class of all scorers (see the module docstring for the call order): an object a subclass's constructor
    makes is its frozen specification; :meth:`bind` returns an accumulator bound to a model.

    Attributes:
        name: the ``build_scorer`` name.
        requires_data: ``update`` must see batches before ``compute``.
        requires_labels: batches must be ``(images, labels)``.
        views: the pruning-data views the scorer is defined on when its needs do not imply them
            (``"plain"``: ``[B, C, H, W]`` images, for forward-only and output-sensitivity scorers); None: multi-crop
            views for label-free data scorers, labeled plain views for label-based ones.
    """

    name: str = "scorer"
    #: every scorer class that names itself (its own ``name``), by that name: :func:`snapvit_pl.scoring.build_scorer`'s
    #: choices (a class defined anywhere, a user's too, is registered as it is defined)
    registry: ClassVar[dict[str, type["Scorer"]]] = {}
    requires_data: bool = True
    requires_labels: bool = False
    views: Optional[str] = None
    #: passes over the data before ``compute`` (``next_pass`` between them, after ``reduce``)
    passes: int = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:  # (a base of scorers: no name of its own)
            return
        known = Scorer.registry.get(cls.name)
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise TypeError(f"scorer name {cls.name!r} of {cls.__module__}.{cls.__qualname__} is taken by "
                            f"{known.__module__}.{known.__qualname__}; give the class another name")
        Scorer.registry[cls.name] = cls

    _frozen = False  # (set on an object once its constructor returns: a specification)

    def __setattr__(self, key: str, value: Any) -> None:
        if self._frozen:
            raise ScoringError(f"{type(self).__name__} is a specification: its arguments are fixed once made ({key} "
                               "cannot be set); make another with the arguments you want, or bind it to a model for "
                               "statistics: scorer.bind(model, context)")
        object.__setattr__(self, key, value)

    def __delattr__(self, key: str) -> None:
        if self._frozen:
            raise ScoringError(f"{type(self).__name__} is a specification: its arguments are fixed once made")
        object.__delattr__(self, key)

    @classmethod
    def accumulator_type(cls) -> type["Scorer"]:
        """This class's accumulator type (made once: a subclass of this class and :class:`Accumulator`)."""
        made = cls.__dict__.get("_accumulator_type")
        if made is None:
            made = type(f"{cls.__name__}Accumulator", (cls, Accumulator),
                        {"__module__": cls.__module__, "__qualname__": f"{cls.__qualname__}Accumulator",
                         "__doc__": f"{cls.__name__} bound to a model (:meth:`Scorer.bind`)."})
            cls._accumulator_type = made
        return made

    def bind(self, model: nn.Module, context: Optional[ScoringContext] = None) -> "Scorer":
        """An accumulator of this specification bound to ``model`` (the bare timm model, not a DDP wrapper, on the
        device the batches go to): what a run feeds its batches to. This object stays as it is.

        Args:
            model: the model to score.
            context: what the run hands over (default: :class:`ScoringContext`'s defaults).
        """
        if isinstance(self, Accumulator):
            raise ScoringError(f"{self.name}: this scorer is already bound to a model; bind its specification")
        # a new object of the accumulator type holding the arguments as they are (checked when this specification
        # was made); a list or mapping argument is the accumulator's own, never shared
        bound = object.__new__(type(self).accumulator_type())
        for key, value in vars(self).items():
            if key != "_frozen":
                setattr(bound, key, copy.deepcopy(value) if isinstance(value, (list, dict, set)) else value)
        bound.setup(model, context)
        return bound

    def setup(self, model: nn.Module, context: Optional[ScoringContext] = None) -> None:
        """Bind this accumulator to ``model`` and reset its statistics: called by :meth:`bind`, and what a subclass
        extends (calling this first) to make its own accumulators."""
        self._require_bound()
        self.model = model
        self.blocks = prunable_blocks(model)
        self.context = context or ScoringContext()

    def update(self, batch: Any) -> dict[str, float]:
        """Accumulate one batch; returns metrics to log (e.g. ``{"loss": ...}``)."""
        return {}

    def _batch(self, batch: Any) -> tuple[Tensor, Optional[Tensor]]:
        """Every ``update``'s preamble: the scorer bound, its state on the model's device, the batch parsed
        (:func:`split_batch`) and its images on the model's device and dtype."""
        self._require_bound()
        self._follow_device()
        images, labels = split_batch(batch)
        return to_model(images, *model_device_dtype(self.model)), labels

    def _follow_device(self) -> None:
        """Lightning may move the model after ``setup``: the scorer's state follows it (:meth:`_rebind`, the
        accumulators, a teacher copy of its own)."""
        device = model_device_dtype(self.model)[0]
        if getattr(self, "_device", device) != device:
            self._device = device
            self._rebind()
            if getattr(self, "_acc", None):
                self._acc = {k: v.to(device) for k, v in self._acc.items()}
        teacher = getattr(self, "teacher", None)
        if teacher is not None and getattr(self, "_own_teacher", False) and next(teacher.parameters()).device != device:
            teacher.to(device)

    def _rebind(self) -> None:
        """Find again what the scorer reads of the model (its parameters) after it moved; nothing by default."""

    def choices(self) -> dict[str, Any]:
        """What the scorer chose for itself at :meth:`setup` (e.g. ``gram: auto`` resolved on the device), for the
        run's record; empty for most scorers."""
        return {}

    def reduce(self, all_reduce_sum: Callable[[Tensor], Tensor]) -> None:
        """Sum the accumulators over processes (call once, on every process, before ``compute``)."""

    def next_pass(self) -> None:
        """Between two passes over the data (after :meth:`reduce`): a scorer of several :attr:`passes` takes what the
        pass measured and starts the next."""
        raise ScoringError(f"{self.name} makes {self.passes} pass(es) over the data; compute() gives the scores")

    @abstractmethod
    def compute(self) -> LocalScores:
        """The local scores from everything seen so far."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def config(self) -> dict[str, Any]:
        """The constructor arguments."""
        params = inspect.signature(type(self).__init__).parameters.values()
        return {p.name: getattr(self, p.name) for p in params if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.config().items())})"

    def _require_bound(self) -> None:
        if not isinstance(self, Accumulator):
            raise ScoringError(f"{self.name} is a specification; bind it to the model first: "
                               "scorer = scorer.bind(model, context)")


class SummedStatistics(Scorer):
    """A scorer whose statistics are sums over samples: ``self._acc`` (name -> tensor), ``self._batches``,
    ``self._samples`` and ``self._device``. It gets the DDP reduction (a sum of every accumulator and of both
    counts, in place: never a gathered copy per process), the resume state and device following from here; a
    subclass sets them in ``setup``."""

    def _init_accumulators(self) -> dict[str, Tensor]:
        return {k: torch.zeros_like(v) for k, v in self._acc.items()}

    def _start_counting(self) -> None:
        """End of ``setup`` (``self._acc`` made): zero counts."""
        self._batches, self._samples = 0, 0

    def _note_finite(self, finite: Tensor) -> None:
        """Remember the first batch (1-based, counted after it) whose statistics were not finite, on the device: the
        flag is read once per pass (:meth:`_check_finite_batches`), not once per batch: a batch never waits for the
        device."""
        bad = (~finite).to(torch.int64) * self._batches
        first = getattr(self, "_first_bad", None)
        self._first_bad = bad if first is None else torch.where(first > 0, first, bad)

    def _check_finite_batches(self) -> None:
        """``DataError`` naming the first batch with non-finite statistics since the last check (one host read)."""
        first, self._first_bad = getattr(self, "_first_bad", None), None
        if first is not None and int(first) > 0:
            raise DataError(f"{self.name}: non-finite mask gradients (batch {int(first)}); check the images")

    def _identity(self) -> dict[str, Any]:
        """What a saved state must match to be resumed by this scorer (its name and settings)."""
        return {"scorer": self.name, "config": self.config()}

    def reduce(self, all_reduce_sum: Callable[[Tensor], Tensor]) -> None:
        self._require_bound()
        self._check_finite_batches()
        self._follow_device()
        for key in sorted(self._acc):
            self._acc[key] = all_reduce_sum(self._acc[key])
        counts = all_reduce_sum(torch.tensor([self._batches, self._samples], dtype=torch.float64, device=self._device))
        self._batches, self._samples = (int(round(c)) for c in counts.tolist())

    def state_dict(self) -> dict[str, Any]:
        """Counts and accumulators (CPU tensors); a specification (not bound to a model): the empty state."""
        if not isinstance(self, Accumulator):
            return {**self._identity(), "batches": 0, "samples": 0, "accumulators": {}}
        self._check_finite_batches()  # progress saved is finite
        return {**self._identity(), "batches": self._batches, "samples": self._samples,
                "accumulators": {k: v.detach().cpu().clone() for k, v in self._acc.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore accumulators and counts into an accumulator (:meth:`bind`): a specification holds no statistics.

        Raises:
            CheckpointError: the state is another scorer's or another specification's, or does not fit the model.
            ScoringError: this scorer is a specification, not bound to a model.
        """
        identity = self._identity()
        if any(state.get(k) != v for k, v in identity.items()):
            def described(d: dict[str, Any]) -> str:
                return " ".join(f"({k} {d.get(k)})" for k in identity if k != "scorer")
            raise CheckpointError(f"scorer state of {state.get('scorer')} {described(state)} cannot resume "
                                  f"{self.name} {described(identity)}; use the same scorer settings")
        if not isinstance(self, Accumulator):
            raise ScoringError(f"{self.name}: a specification holds no statistics; load the state into its "
                               "accumulator (scorer.bind(model, context).load_state_dict(state))")
        saved = state["accumulators"]
        if not saved and not state["batches"]:  # the empty state of a scorer saved before its setup
            self._acc = self._init_accumulators()
            self._batches, self._samples = 0, 0
            return
        if set(saved) != set(self._acc) or any(saved[k].shape != v.shape for k, v in self._acc.items()):
            raise CheckpointError(f"{self.name} state does not fit this model (other blocks or widths)")
        for key, value in self._acc.items():
            value.copy_(saved[key])
        self._batches, self._samples = int(state["batches"]), int(state["samples"])


# -- batches -----------------------------------------------------------------------------------
def split_batch(batch: Any) -> tuple[Tensor, Optional[Tensor]]:
    """``(images, labels or None)`` from a tensor or an ``(images, labels, ...)`` tuple/list.

    ``images`` is ``[B, C, H, W]`` or multi-crop ``[B, V, C, H, W]``.

    Raises:
        DataError: anything else.
    """
    if isinstance(batch, Tensor):
        images, labels = batch, None
    elif isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], Tensor):
        images, labels = batch[0], (batch[1] if len(batch) > 1 else None)
    else:
        raise DataError(
            f"a scoring batch must be an image tensor or an (images, labels) pair, got {type(batch).__name__}"
        )
    if images.dim() not in (4, 5):
        raise DataError(
            f"scoring images must be [B, C, H, W] or multi-crop [B, V, C, H, W], got shape {tuple(images.shape)}"
        )
    if labels is not None and not isinstance(labels, Tensor):
        labels = torch.as_tensor(labels)
    return images, labels


# -- per-unit weight rows ----------------------------------------------------------------------
@dataclass(frozen=True)
class Rows:
    """Some sections of a weight whose rows hold one slice per unit.

    The weight is ``[num_sections * num_units * unit_size, in_features]``; ``sections`` is the
    ``(start, stop)`` range of sections used (e.g. ``(2, 3)``: the V part of a fused qkv).
    """

    label: str
    weight: nn.Parameter
    num_sections: int
    sections: tuple[int, int]

    def view(self, tensor: Tensor, group: UnitGroup) -> Tensor:
        """``tensor`` (shaped like ``weight``) as ``[S, num_units, unit_size, in]``, selected sections."""
        start, stop = self.sections
        return tensor.view(self.num_sections, group.num_units, group.unit_size, -1)[start:stop]


def _weight(group: UnitGroup, path: str) -> nn.Parameter:
    return group.module.get_submodule(path.rpartition(".")[0]).weight


def head_rows(group: UnitGroup, which: str) -> list[Rows]:
    """Rows of the attention input projection per head: ``which="v"`` (V only) or ``"qkv"``."""
    paths = {slot.path: slot for slot in group.slots}
    if "qkv.weight" in paths:
        span = (2, 3) if which == "v" else (0, 3)
        return [Rows("attention qkv", _weight(group, "qkv.weight"), 3, span)]
    names = ("v",) if which == "v" else ("q", "k", "v")
    return [Rows(f"attention {n}_proj", _weight(group, f"{n}_proj.weight"), 1, (0, 1)) for n in names]


def neuron_rows(group: UnitGroup) -> list[Rows]:
    """Rows of the first MLP layer per hidden neuron (both halves of a gated MLP)."""
    rows = []
    for slot in group.slots:
        if slot.path in ("fc1.weight", "fc1_g.weight", "fc1_x.weight"):
            name = slot.path.rpartition(".")[0]
            rows.append(Rows(f"MLP {name}", _weight(group, slot.path), slot.sections, (0, slot.sections)))
    return rows


def unit_sum(views: Sequence[Tensor]) -> Tensor:
    """Per-unit sum over ``[S, U, unit_size, in]`` views -> ``[U]``."""
    return sum(v.sum(dim=(0, 2, 3)) for v in views)


def unit_count(views: Sequence[Tensor]) -> int:
    """Entries per unit over ``[S, U, unit_size, in]`` views."""
    return sum(v.numel() // v.shape[1] for v in views)


def unit_mean(views: Sequence[Tensor]) -> Tensor:
    """Per-unit mean over ``[S, U, unit_size, in]`` views (all of them together) -> ``[U]``."""
    return unit_sum(views) / unit_count(views)


# -- model state helpers -----------------------------------------------------------------------
@contextmanager
def grad_only(model: nn.Module, params: Sequence[Tensor]) -> Iterator[None]:
    """Enable autograd (also inside ``torch.inference_mode``) for ``params`` and nothing else of ``model``."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    wanted = {id(p) for p in params}
    try:
        for p, _ in flags:
            p.requires_grad_(id(p) in wanted)
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def model_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    param = next(model.parameters())
    return param.device, param.dtype


def to_model(images: Tensor, device: torch.device, dtype: torch.dtype) -> Tensor:
    """Images on the model's device and float dtype (and usable by autograd)."""
    if not images.is_floating_point():
        raise DataError(
            f"scoring images must be normalised float tensors, got {images.dtype}; apply the model's transform"
        )
    images = images.to(device=device, dtype=dtype, non_blocking=True)
    return images.clone() if images.is_inference() else images
