"""``python -m snapvit_pl.deploy``: export a pruned checkpoint to ONNX, optionally check and time it.

Errors the user can fix (:class:`snapvit_pl.errors.SnapViTError`) print one line and exit with
status 2; ``--verbose`` re-raises them with their traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..errors import ConfigError, SnapViTError, exit_with_error
from ..eval.throughput import measure_throughput
from ..models import input_shape, load_pruned
from . import INSTALL_HINT


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m snapvit_pl.deploy", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="pruned checkpoint directory (written by prune.py / save_pruned)")
    parser.add_argument("--out", required=True, help="the .onnx file to write")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset version (default: 17)")
    parser.add_argument("--batch-size", type=int, default=8, help="batch size of --check and --benchmark (default: 8)")
    parser.add_argument("--check", action="store_true", help="print the max abs difference of ONNX Runtime vs PyTorch")
    parser.add_argument("--benchmark", action="store_true", help="print ONNX Runtime and PyTorch CPU throughput")
    parser.add_argument("--verbose", action="store_true", help="show the traceback of errors")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    Args:
        argv: arguments without the program name (default: ``sys.argv[1:]``).
    """
    args = _parser().parse_args(argv)
    try:
        try:
            from .onnx import check_onnx, export_onnx, onnx_throughput
        except ImportError as err:
            raise ConfigError(f"ONNX export needs the deploy extra ({err.name or err} is missing): {INSTALL_HINT}") from err
        model, _ = load_pruned(args.checkpoint)
        try:
            path = export_onnx(model, args.out, opset=args.opset)
        except OSError as err:
            raise ConfigError(f"cannot write {args.out} ({err.strerror or err}); choose a writable --out") from err
    except SnapViTError as err:
        return exit_with_error(err, args.verbose)
    print(f"wrote {path} (opset {args.opset}, dynamic batch)")
    if args.check:
        diff = check_onnx(model, path, batch_size=args.batch_size)
        print(f"max abs diff onnxruntime vs PyTorch (batch {args.batch_size}): {diff:.3g}")
    if args.benchmark:
        shape = input_shape(model)
        ours = onnx_throughput(path, shape, batch_size=args.batch_size)
        theirs = measure_throughput(model, shape, batch_size=args.batch_size, device="cpu").images_per_second
        print(f"throughput on CPU (batch {args.batch_size}): onnxruntime {ours:.1f} images/s, PyTorch {theirs:.1f} images/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
