"""Deployment: ONNX export (checked and timed with ONNX Runtime) and ``torch.export`` programs."""
from .onnx import check_onnx, export_onnx, onnx_throughput
from .program import export_program

__all__ = ["check_onnx", "export_onnx", "export_program", "onnx_throughput"]
