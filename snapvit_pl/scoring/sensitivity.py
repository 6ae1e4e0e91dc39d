"""Per-sample unit-mask scorers: how much the model's output depends on each head and MLP neuron.

Every unit gets a mask ``m_{n,u}`` per sample ``n`` (1 in the dense model) that multiplies its
contribution: a head's slice of the ``attn.proj`` input, a neuron's channel of the ``mlp.fc2``
input. The gradient of a per-sample objective ``L_n`` with respect to ``m_{n,u}`` is
``sum_t sum_{c in u} x_{n,t,c} dL_n/dx_{n,t,c}``: what removing the unit (``m: 1 -> 0``) changes to
first order. One backward pass gives it for every sample and every unit at once (the masks are
leaves of the graph; no weight needs a gradient).

- :class:`OutputSensitivity` (``sensitivity``): Gauss-Newton (Fisher-Rao) importance of the
  L2-normalised embedding, ``E_n ||d f(x_n) / d m_{n,u}||^2``: to second order, twice the
  embedding drift ``1 - cos`` that removing the unit alone causes, i.e. the search's fitness
  (LeCun et al.'s optimal brain damage with the Gauss-Newton Hessian of that drift). Estimated with
  random Gaussian probes ``r``: ``E_r[(r . df/dm)^2] = ||df/dm||^2``, each probe one backward pass.
  Plain images, no labels, no teacher, no loss target.
- :class:`SSLMaskFisher` (``ssl_mask_fisher``): the per-sample Fisher of SnapViT's self-distillation
  loss with respect to the masks, ``E_n[(dL_n/dm_{n,u})^2]`` (Theis et al. 2018, "Faster gaze
  prediction with dense networks and Fisher pruning"), from multi-crop views and a frozen teacher.

Statistics are sums over samples (float64); probes are drawn on the images' device, per sample, from a
seed hashed from the sample's pixels (integer arithmetic: the same on any batch), so neither batching,
batch order nor DDP sharding changes the scores beyond float rounding.
"""
from __future__ import annotations

import math
from abc import abstractmethod
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import DataError
from ..models.embedding import embed
from ..models.modes import eval_mode
from ..models.units import UnitGroup
from ..ranges import NonNegativeInt, Seed, check_arguments, one_of
from ..seeding import resolve_seed
from .activation import output_layer
from .base import LocalScores, ScoringContext, SummedStatistics, grad_only, model_device_dtype
from .gradient import _SelfDistillation, self_distillation_loss


@contextmanager
def unit_masks(groups: list[tuple[str, str, UnitGroup]], masks: dict[str, Tensor], repeat: int = 1,
               observe: Optional[Callable[[str, Tensor], None]] = None) -> Iterator[None]:
    """Multiply each group's output-projection input by its per-sample mask ``masks[key]`` ``[samples, units]``.

    ``repeat``: consecutive images per sample (multi-crop views flattened sample-major); ``observe(key, x)``: sees
    each masked input as it goes in.
    """
    handles = []

    def hook(key: str, group: UnitGroup) -> Callable:
        def apply(_module: nn.Module, inputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
            x = inputs[0]
            m = masks[key].repeat_interleave(group.unit_size, dim=1).repeat_interleave(repeat, dim=0)
            m = m.view(m.shape[0], *([1] * (x.dim() - 2)), m.shape[1]).to(x.dtype)
            if observe is not None:
                observe(key, x * m)
            return (x * m,) + tuple(inputs[1:])
        return apply

    try:
        for key, kind, group in groups:
            handles.append(output_layer(group, kind).register_forward_pre_hook(hook(key, group)))
        yield
    finally:
        for handle in handles:
            handle.remove()


_MASK32 = 0xFFFFFFFF


def _hash32(x: Tensor) -> Tensor:
    """A bijective 32-bit integer hash, elementwise on int64 tensors holding values in ``[0, 2^32)`` (every product
    stays below 2^63)."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    return (x >> 16) ^ x


def probe_seeds(images: Tensor, seed: int) -> Tensor:
    """One 32-bit seed per sample ``[n]`` (int64, on the images' device), hashed from its pixels' bits and ``seed``:
    the same sample gets the same seed in any batch, on any rank (the per-pixel hashes are summed as integers)."""
    flat = images.detach().float().contiguous().reshape(images.shape[0], -1)
    bits = flat.view(torch.int32).to(torch.int64) & _MASK32
    position = _hash32(torch.arange(flat.shape[1], device=flat.device, dtype=torch.int64))
    total = _hash32(bits ^ position).sum(dim=1) & _MASK32  # exact: any reduction order gives the same sum
    return _hash32(total ^ _hash32(seed & _MASK32))  # the seed hashed as a Python int: nothing copied to the device


def gaussian_probes(seeds: Tensor, count: int, dim: int) -> Tensor:
    """``[count, n, dim]`` standard normal probes, each sample's a function of its seed alone (a counter-based
    generator on the seeds' device: a hash of (seed, probe, coordinate) per uniform, then Box-Muller)."""
    counter = torch.arange(count * dim, device=seeds.device, dtype=torch.int64).view(count, 1, dim)
    base = seeds.view(1, -1, 1)

    def uniform(stream: int) -> Tensor:
        return (_hash32(_hash32(2 * counter + stream) ^ base).double() + 0.5) / 2.0 ** 32

    radius = torch.sqrt(-2.0 * torch.log(uniform(0)))
    return (radius * torch.cos(2 * math.pi * uniform(1))).float()


class MaskGradientScorer(SummedStatistics):
    """Shared machinery: per-sample unit masks, squared mask gradients summed over samples."""

    requires_labels = False

    def setup(self, model: nn.Module, context: Optional[ScoringContext] = None) -> None:
        super().setup(model, context)
        self._device, self._dtype = model_device_dtype(model)
        self._groups = [(f"{b.index}.{kind}", kind, getattr(b, kind)) for b in self.blocks for kind in ("heads", "neurons")]
        for key, kind, group in self._groups:
            output_layer(group, kind)
        self._acc = {key: torch.zeros(group.num_units, dtype=torch.float64, device=self._device)
                     for key, _, group in self._groups}
        self._start_counting()

    def _masks(self, samples: int) -> dict[str, Tensor]:
        return {key: torch.ones(samples, group.num_units, device=self._device, dtype=torch.float32, requires_grad=True)
                for key, _, group in self._groups}

    @abstractmethod
    def _squared_gradients(self, images: Tensor, labels: Optional[Tensor]) -> tuple[dict[str, Tensor], int, float]:
        """Per group, ``sum_n (mask gradient)^2`` ``[units]`` over the batch's samples; (that, samples, loss)."""

    def update(self, batch: Any) -> dict[str, float]:
        images, labels = self._batch(batch)
        with eval_mode(self.model), grad_only(self.model, []):
            sums, samples, loss = self._squared_gradients(images, labels)
        finite = torch.stack([torch.isfinite(v).all() for v in sums.values()]).all()
        for key, value in sums.items():
            self._acc[key].add_(value.double())
        self._batches += 1
        self._samples += samples
        self._note_finite(finite)
        # 0-d tensors on the device: read when shown (no host synchronisation per batch)
        return {k: v.detach() for k, v in {**({} if loss is None else {"loss": loss}), **self._logged()}.items()}

    def _logged(self) -> dict[str, Tensor]:
        """What to log per batch besides the loss, as 0-d tensors (read when shown)."""
        return {}

    def compute(self) -> LocalScores:
        self._require_bound()
        self._check_finite_batches()
        if self._samples == 0:
            raise DataError(f"{self.name} saw no batches: feed the scoring data through update() before compute()")
        scores = {key: (value / self._samples).float().cpu() for key, value in self._acc.items()}
        return LocalScores([scores[f"{b.index}.heads"] for b in self.blocks],
                           [scores[f"{b.index}.neurons"] for b in self.blocks])

Target = one_of("normalized", "raw")


def probe_vjps(out: Tensor, leaves: list[Tensor], probes: Tensor, batched: bool) -> Iterator[list[Tensor]]:
    """Per probe ``r`` of ``probes`` ``[K, *out.shape]``, the gradients of ``(r * out).sum()`` with respect to
    ``leaves``: all in one vectorised backward pass (``batched``, ``is_grads_batched``: fewer, larger kernels for
    an accelerator) or one pass per probe (on the CPU this measured faster: ViT-B/16, 1 thread, 8 probes)."""
    if batched:
        grads = torch.autograd.grad(out, leaves, grad_outputs=probes.contiguous(), is_grads_batched=True)
        yield from (list(g) for g in zip(*grads))
        return
    for k in range(probes.shape[0]):
        yield list(torch.autograd.grad(out, leaves, grad_outputs=probes[k], retain_graph=k + 1 < probes.shape[0]))


#: Random probes per image of the default score: each is one backward pass, so the importance pass costs about
#: ``1 + DEFAULT_PROBES`` forward-pass equivalents per image. 4 ranks units as 8 does on the four development models
#: (docs/method.md, "How the defaults were chosen"; 3 seeds, 1000 images, paired by seed).
DEFAULT_PROBES = 4


class OutputSensitivity(MaskGradientScorer):
    """Gauss-Newton sensitivity of the embedding to each unit: ``E_n ||d f(x_n)/d m_{n,u}||^2`` (label-free).

    ``f`` is the backbone's embedding (:func:`snapvit_pl.models.embed`), L2-normalised
    (``target="normalized"``, default: the cosine geometry of the search's fitness; optionally centred
    by ``center`` first, e.g. the dense embeddings' mean, as the fitness's PCA centres them) or as it is
    (``target="raw"``). See the module docstring.

    Args:
        probes: random Gaussian probes per sample (backward passes per batch); 0: exact, one backward pass
            per embedding dimension (the probes are then the unit vectors).
        target: ``"normalized"`` or ``"raw"``.
        seed: seed of the probes (mixed with each sample's pixels); None: prune.py's ``seed_everything`` (0 from
            Python).
        center: optional ``[D]`` vector subtracted from the embeddings before normalising.
    """

    name = "sensitivity"
    views = "plain"

    def __init__(self, probes: NonNegativeInt = DEFAULT_PROBES, target: Target = "normalized",
                 seed: Optional[Seed] = None, center: Optional[list] = None):
        check_arguments(OutputSensitivity.__init__, locals(), "importance.scorer.init_args", skip={"self"})
        seed = resolve_seed(seed)
        self.probes, self.target, self.seed, self.center = int(probes), target, seed, center

    def _probe_gradients(self, images: Tensor) -> Iterator[list[Tensor]]:
        """Per probe, the mask gradients ``[n, units]`` of every group (in ``self._groups`` order)."""
        n = images.shape[0]
        masks = self._masks(n)
        with torch.inference_mode(False), torch.enable_grad(), unit_masks(self._groups, masks):
            out = embed(self.model, images).float()
            if self.center is not None:
                out = out - torch.as_tensor(self.center, dtype=out.dtype, device=out.device)
            if self.target == "normalized":
                out = F.normalize(out, dim=-1)
            if self.probes == 0:
                probes = torch.eye(out.shape[1], device=out.device)[:, None, :].expand(-1, n, -1)  # [D, n, D]
            else:
                probes = gaussian_probes(probe_seeds(images, self.seed), self.probes, out.shape[1])  # [K, n, D]
            leaves = [masks[key] for key, _, _ in self._groups]
            yield from probe_vjps(out, leaves, probes, batched=out.device.type != "cpu")

    def _probe_scale(self) -> int:
        return 1 if self.probes == 0 else self.probes


    def _logged(self) -> dict[str, Tensor]:
        """What the scores measure so far, logged per batch: the mean estimated drift
        of the embedding when one head (``drift_per_head``) or one MLP neuron (``drift_per_neuron``) is removed
        alone, ``E_n ||d f(x_n) / d m_u||^2 / 2`` averaged over the units (second order; with the normalised
        target, ``1 - cos`` between the dense and the pruned embedding)."""
        totals = [torch.stack([self._acc[key].sum() / self._acc[key].numel() for key, kind, _ in self._groups
                               if kind == wanted]).mean() / (2 * self._samples) for wanted in ("heads", "neurons")]
        return {"drift_per_head": totals[0], "drift_per_neuron": totals[1]}

    def _squared_gradients(self, images: Tensor, labels: Optional[Tensor]):
        if images.dim() == 5:
            images = images.flatten(0, 1)
        sums = {key: torch.zeros(group.num_units, dtype=torch.float64, device=self._device)
                for key, _, group in self._groups}
        for grads in self._probe_gradients(images):
            for (key, _, _), g in zip(self._groups, grads):
                sums[key] += g.double().square().sum(dim=0)
        return {key: value / self._probe_scale() for key, value in sums.items()}, images.shape[0], None


class SSLMaskFisher(_SelfDistillation, MaskGradientScorer):
    """Per-sample Fisher of the self-distillation loss with respect to the unit masks (label-free).

    ``E_n[(dL_n/dm_{n,u})^2]``, ``L_n`` :class:`SSLFisher`'s loss of sample ``n`` (all its views
    through the masked student, its global views through the frozen dense teacher).

    Args:
        n_global: as for :class:`SSLFisher` (None, default: the DataModule's ``n_global_views``).
    """

    name = "ssl_mask_fisher"

    def __init__(self, n_global: Optional[int] = None):
        self.n_global = n_global
        self._check_n_global()

    def _squared_gradients(self, images: Tensor, labels: Optional[Tensor]):
        G = self.global_views
        if images.dim() != 5 or images.shape[1] < max(2, G):
            raise DataError(f"{self.name} needs multi-crop batches [B, V, C, H, W] with V >= 2 views, got "
                            f"{tuple(images.shape)}")
        B, V = images.shape[:2]
        masks = self._masks(B)
        with torch.no_grad(), eval_mode(self.teacher):
            target = embed(self.teacher, images[:, :G].flatten(0, 1)).view(B, G, -1)
        with torch.inference_mode(False), torch.enable_grad(), unit_masks(self._groups, masks, repeat=V):
            student = embed(self.model, images.flatten(0, 1)).view(B, V, -1)
            loss = self_distillation_loss(student, target) * B  # the sum of the per-sample losses
            grads = torch.autograd.grad(loss, [masks[key] for key, _, _ in self._groups])
        sums = {key: g.double().square().sum(dim=0) for (key, _, _), g in zip(self._groups, grads)}
        return sums, B, loss.detach() / B  # a 0-d tensor: read back with the batch's one host sync
