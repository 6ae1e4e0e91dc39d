"""Deployment: ONNX export (checked and timed with ONNX Runtime) and ``torch.export`` programs.

The ONNX functions need the ``deploy`` extra (``pip install 'snapvit-pl[deploy]'``: onnx, onnxruntime);
they are imported on first use, so ``export_program`` works without it.
"""
from __future__ import annotations

import importlib
from typing import Any

from .program import export_program

_ONNX = ("check_onnx", "export_onnx", "onnx_throughput")
INSTALL_HINT = "pip install 'snapvit-pl[deploy]' (onnx and onnxruntime)"

__all__ = ["check_onnx", "export_onnx", "export_program", "onnx_throughput"]


def __getattr__(name: str) -> Any:
    if name in _ONNX:
        return getattr(importlib.import_module(".onnx", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
