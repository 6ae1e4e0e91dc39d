"""ONNX export of (pruned) timm ViTs, checked and timed with ONNX Runtime.

The export uses PyTorch's TorchScript-based exporter (``dynamo=False``): the torch.export-based
default of ``torch.onnx.export`` needs the ``onnxscript`` package, which snapvit-pl does not
depend on, while the TorchScript exporter handles every supported family with plain ``onnx``.
Attention is traced on timm's explicit (non-SDPA) path, so the graph uses only standard ops. The
batch axis is dynamic; the image size is fixed at export time.
"""
from __future__ import annotations

import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from ..eval.throughput import REPEATS, WARMUP
from ..io import atomic_path
from ..models import input_shape as model_input_shape
from ..models import eval_mode, manual_attention
from .program import example_input

INPUT, OUTPUT = "images", "output"


def _pack_external_data(tmp: Path, name: str) -> None:
    """Gather the per-weight files the exporter writes for models over 2 GiB into ``name.data``."""
    proto = onnx.load(str(tmp))
    for leftover in tmp.parent.iterdir():
        if leftover != tmp:
            leftover.unlink()
    onnx.save_model(proto, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True, location=f"{name}.data")


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    input_shape: Sequence[int] | None = None,
    opset: int = 17,
    dynamic_batch: bool = True,
) -> Path:
    """Export ``model`` to an ONNX file with input ``images`` and output ``output``, written atomically.

    Models over 2 GiB get their weights in ``<path>.data`` beside ``<path>`` (written first).

    Args:
        model: a (pruned) timm ViT; its train/eval mode and attention settings are restored.
        path: the ``.onnx`` file to write.
        input_shape: (C, H, W) of one image; default: what the model expects.
        opset: ONNX opset version.
        dynamic_batch: make the batch axis dynamic (else it is fixed to 1).
    """
    path = Path(path)
    shape = tuple(input_shape) if input_shape is not None else model_input_shape(model)
    axes = {INPUT: {0: "batch"}, OUTPUT: {0: "batch"}} if dynamic_batch else None
    with atomic_path(path) as tmp, eval_mode(model), manual_attention(model), torch.no_grad():
        with warnings.catch_warnings():
            # Shape checks traced as constants (the image size is fixed) and the exporter's own deprecation notices.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(
                model, (example_input(model, shape, 2 if dynamic_batch else 1),), str(tmp), dynamo=False, opset_version=opset,
                input_names=[INPUT], output_names=[OUTPUT], dynamic_axes=axes,
            )
        if any(p != tmp for p in tmp.parent.iterdir()):
            _pack_external_data(tmp, path.name)
            os.replace(tmp.parent / f"{path.name}.data", path.parent / f"{path.name}.data")
    return path


def _session(path: str | os.PathLike) -> ort.InferenceSession:
    """A CPU ONNX Runtime session using as many threads as PyTorch, for like-for-like timings."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _image_shape(session: ort.InferenceSession) -> tuple[int, ...]:
    return tuple(session.get_inputs()[0].shape[1:])


@torch.no_grad()
def check_onnx(model: nn.Module, path: str | os.PathLike, batch_size: int = 4) -> float:
    """Max abs difference between ONNX Runtime (CPU) and ``model`` on one random batch.

    Args:
        model: the PyTorch model the file was exported from.
        path: the ``.onnx`` file.
        batch_size: images in the batch (any size works with a dynamic batch axis).
    """
    session = _session(path)
    x = example_input(model, _image_shape(session), batch_size)
    with eval_mode(model):
        expected = model(x).float().cpu().numpy()
    actual = session.run(None, {session.get_inputs()[0].name: x.cpu().numpy()})[0]
    return float(np.abs(actual - expected).max())


def onnx_throughput(
    path: str | os.PathLike,
    input_shape: Sequence[int] | None,
    batch_size: int,
    warmup: int = WARMUP,
    repeats: int = REPEATS,
) -> float:
    """Images per second of ONNX Runtime on CPU: ``batch_size`` / median time of one batch.

    Counterpart of :func:`snapvit_pl.eval.throughput.measure_throughput` (same thread count).

    Args:
        path: the ``.onnx`` file.
        input_shape: (C, H, W) of one image; default: read from the file.
        batch_size: images per run.
        warmup: untimed runs first.
        repeats: timed runs; the median is reported.
    """
    session = _session(path)
    shape = tuple(input_shape) if input_shape is not None else _image_shape(session)
    feed = {session.get_inputs()[0].name: np.random.default_rng(0).standard_normal((batch_size, *shape), np.float32)}
    timings = []
    for iteration in range(warmup + repeats):
        start = time.perf_counter()
        session.run(None, feed)
        if iteration >= warmup:
            timings.append(time.perf_counter() - start)
    return batch_size / statistics.median(timings)
