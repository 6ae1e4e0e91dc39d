"""Measured inference throughput and peak memory of a model."""

import statistics
import time
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
from torch import nn

from ..device import autocast_context, resolve_device, synchronize
from ..models.modes import eval_mode


@dataclass
class ThroughputResult:
    """Throughput measurement.

    Attributes:
        images_per_second: batch_size / median batch time.
        median_batch_seconds: median wall time of one forward of a batch.
        batch_size: images per forward.
        peak_memory_bytes: CUDA max_memory_allocated during the measurement; None on CPU
            (process RSS deltas there mostly reflect allocator caching, not the model).
        device: device the model ran on.
    """

    images_per_second: float
    median_batch_seconds: float
    batch_size: int
    peak_memory_bytes: Optional[int]
    device: str


#: Untimed and timed forwards of a throughput measurement (the median of the timed ones is kept).
WARMUP, REPEATS = 5, 20


@torch.inference_mode()
def measure_throughput(
    model: nn.Module,
    input_shape: Sequence[int],
    batch_size: int,
    warmup: int = WARMUP,
    repeats: int = REPEATS,
    device: Union[str, torch.device, None] = None,
    precision: str = "auto",
) -> ThroughputResult:
    """Time forwards of a random batch: warm-up iterations, then the median of timed repeats.

    The model is moved to `device` and put in eval mode; its train/eval mode is restored.

    Args:
        model: module taking a [batch_size, *input_shape] tensor.
        input_shape: shape of one input, without the batch dimension.
        batch_size: inputs per forward.
        warmup: untimed forwards first.
        repeats: timed forwards; the median is reported.
        device: where to run (default: CUDA if available).
        precision: "auto" (bf16 autocast on CUDA, fp32 on CPU), "bf16" or "32".
    """
    device = resolve_device(device)
    on_cuda = device.type == "cuda"
    model.to(device)
    inputs = torch.randn(batch_size, *input_shape, device=device)
    if on_cuda:
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    timings = []
    with eval_mode(model), autocast_context(device, precision):
        for iteration in range(warmup + repeats):
            start = time.perf_counter()
            model(inputs)
            synchronize(device)
            if iteration >= warmup:
                timings.append(time.perf_counter() - start)
    median = statistics.median(timings)
    return ThroughputResult(
        images_per_second=batch_size / median,
        median_batch_seconds=median,
        batch_size=batch_size,
        peak_memory_bytes=torch.cuda.max_memory_allocated(device) if on_cuda else None,
        device=str(device),
    )
