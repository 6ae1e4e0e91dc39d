"""Cut pruned models from an elastic-scores file at any budget, without re-running prune.py.

    python -m snapvit_pl.extract --scores runs/prune/X/elastic_scores.safetensors \\
        --budget flops=0.5 --budget sparsity=0.3 --budget mlp_ratio=0.35,head_ratio=0.2 --out pruned/

The base weights are rebuilt from the spec recorded in the scores (timm hub name or local
file); ``--checkpoint-path`` points at a local copy instead. Their fingerprint must match.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from .elastic import Budget, CostModel, ElasticScores
from .errors import ConfigError, SnapViTError, exit_with_error
from .models import BackboneSpec, load_backbone
from .pipeline.extraction import extract_models


def parse_budget(text: str) -> Budget:
    """``"flops=0.5"`` or ``"mlp_ratio=0.35,head_ratio=0.2"`` -> :class:`Budget`."""
    try:
        fields = {key.strip(): float(value) for key, value in (item.split("=", 1) for item in text.split(","))}
        return Budget(**fields)
    except (ValueError, TypeError) as err:
        if isinstance(err, SnapViTError):
            raise
        raise ConfigError(
            f"cannot read budget {text!r} ({err}); use e.g. flops=0.5, params=2e7, sparsity=0.4 or mlp_ratio=0.35,head_ratio=0.2"
        ) from err


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snapvit_pl.extract", description=__doc__.splitlines()[0])
    parser.add_argument("--scores", required=True, help="elastic_scores.safetensors written by prune.py")
    parser.add_argument("--budget", action="append", required=True,
                        help="repeatable: flops=0.5 | params=N | sparsity=0.4 | latency=MS | mlp_ratio=a,head_ratio=b")
    parser.add_argument("--out", required=True, help="directory receiving one checkpoint per budget")
    parser.add_argument("--checkpoint-path", default=None, help="local base weights (instead of the recorded source)")
    parser.add_argument("--mlp-multiple", type=int, default=1, help="round MLP widths to this multiple (8/16)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing checkpoints")
    parser.add_argument("--latency-batch-size", type=int, default=64, help="batch size of latency=MS budgets (default 64)")
    parser.add_argument("--latency-device", default=None, help="device of latency=MS budgets (default: CUDA if available)")
    parser.add_argument("--latency-table", default=None,
                        help="latency table JSON to reuse or write (default: <out>/latency_table.json)")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)
    try:
        budgets = [parse_budget(b) for b in args.budget]
        scores = ElasticScores.load(args.scores)
        if not scores.base.get("model_name"):
            raise ConfigError(f"{args.scores} does not record how to build its base model (scores from fit_elastic "
                              "without spec=); cut models in Python with scores.extract(model, ...)")
        spec = BackboneSpec.from_dict(scores.base)
        if args.checkpoint_path:
            spec = BackboneSpec(spec.model_name, False, args.checkpoint_path, spec.model_kwargs)
        base = load_backbone(spec)
        scores.check_model(base)
        dense = CostModel(base)
        if any(b.latency is not None for b in budgets):
            from .elastic.latency import latency_table

            dense.latency = latency_table(base, args.latency_batch_size, args.latency_device,
                                          args.latency_table or Path(args.out) / "latency_table.json",
                                          mlp_multiple=args.mlp_multiple)

        def report(item) -> None:
            latency = "" if item.latency_ms is None else \
                f", {item.latency_ms:.2f} ms measured ({item.predicted_latency_ms:.2f} predicted)"
            print(f"{item.checkpoint}: mlp_ratio {item.mlp_ratio:.3f}, head_ratio {item.head_ratio:.3f}, "
                  f"{item.params / dense.dense_params:.1%} params, {item.flops / dense.dense_flops:.1%} FLOPs{latency}")

        extract_models(base, scores, budgets, mlp_multiple=args.mlp_multiple, save_dir=args.out, spec=spec,
                       overwrite=args.overwrite, cost=dense, on_model=report, measure_latency=dense.latency is not None)
    except (SnapViTError, FileExistsError) as err:
        return exit_with_error(err, args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
