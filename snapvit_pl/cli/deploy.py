"""``snapvit-pl deploy`` / ``python -m snapvit_pl.deploy``: a pruned checkpoint to ONNX, optionally checked against
PyTorch and timed with ONNX Runtime (needs the ``deploy`` extra: onnx, onnxruntime).

The ONNX file goes into the checkpoint's directory (``model.onnx``) unless ``--out`` names another."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..io import check_output_file
from .common import command_parser, run_command, writing_to

EPILOG = """examples:
  snapvit-pl deploy --checkpoint runs/prune/X/models/flops0.5 --check true --benchmark true   # .../flops0.5/model.onnx
  snapvit-pl deploy --checkpoint runs/prune/X/models/flops0.5 --out flops0.5.onnx"""
#: The ONNX file's name in the checkpoint's directory when no --out is given.
DEFAULT_NAME = "model.onnx"
_SECTIONS = ("checkpoint", "out", "overwrite", "opset", "batch_size", "check", "benchmark", "verbose")


def build_parser():
    """The ``deploy`` command's parser."""
    parser = command_parser("snapvit-pl deploy", __doc__, _SECTIONS, EPILOG)
    parser.add_argument("--checkpoint", type=str, required=True,
                        help="pruned checkpoint directory (or hf-hub:org/name) written by prune.py / extract")
    parser.add_argument("--out", type=Optional[str], default=None,
                        help=f"the .onnx file to write (default: {DEFAULT_NAME} in the checkpoint's directory)")
    parser.add_argument("--overwrite", type=Optional[bool], default=None,
                        help=f"replace an existing --out file (default: only the {DEFAULT_NAME} of a pruned checkpoint)")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset version")
    parser.add_argument("--batch_size", type=int, default=8, help="batch size of --check and --benchmark")
    parser.add_argument("--check", type=bool, default=False, help="print the max abs difference of ONNX Runtime vs PyTorch")
    parser.add_argument("--benchmark", type=bool, default=False, help="print ONNX Runtime and PyTorch CPU throughput")
    return parser


def _written_here(path: Path) -> bool:
    """Whether ``path`` is the ONNX file this command writes by default: the checkpoint's own :data:`DEFAULT_NAME`."""
    from ..models.checkpoint import RECORD

    return path.name == DEFAULT_NAME and (path.parent / RECORD).is_file()


def main(argv: Optional[list[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    return run_command(_deploy, argv, "snapvit-pl deploy", batch_options=("--batch_size",))


def _deploy(argv: list[str]) -> int:
    from ..deploy import INSTALL_HINT
    from ..errors import ConfigError, StorageError
    from ..eval.throughput import measure_throughput
    from ..models import input_shape, load_pruned

    args = build_parser().parse_args(argv)
    if args.opset < 7 or args.batch_size < 1:
        raise ConfigError(f"--opset must be >= 7 (got {args.opset}) and --batch_size >= 1 (got {args.batch_size})")
    if args.out is None:
        if args.checkpoint.startswith("hf-hub:"):
            raise ConfigError(f"--checkpoint {args.checkpoint} has no local directory to write the ONNX file into; "
                              "give --out FILE.onnx")
        args.out = str(Path(args.checkpoint) / DEFAULT_NAME)
    check_output_file(args.out, "--out", args.overwrite, ours=_written_here)
    writing_to(Path(args.out).parent)
    try:
        from ..deploy.onnx import check_onnx, export_onnx, onnx_throughput
    except ImportError as err:
        raise ConfigError(f"ONNX export needs the deploy extra ({err.name or err} is missing): {INSTALL_HINT}") from err
    model, _ = load_pruned(args.checkpoint)
    try:
        path = export_onnx(model, args.out, opset=args.opset)
    except StorageError:  # (the file, the space on its device: atomic_path's line)
        raise
    except OSError as err:
        raise ConfigError(f"cannot write {args.out} ({err.strerror or err}); choose a writable --out") from err
    except RuntimeError as err:
        if "opset" not in str(err).lower():
            raise
        raise ConfigError(f"--opset {args.opset} is not supported by this PyTorch's ONNX exporter ({err}); the default "
                          "is 17") from err
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
