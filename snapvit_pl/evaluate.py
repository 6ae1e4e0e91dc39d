"""``python -m snapvit_pl.evaluate``: frozen-feature metrics, size and speed of one (pruned or dense) ViT.

    python -m snapvit_pl.evaluate --checkpoint runs/prune/X/models/mlp0.55_head0.40 \\
        --metrics knn,linear,head,seg,throughput --out report.json
    python -m snapvit_pl.evaluate --config configs/prune/demo.yaml      # the dense model of a config

Prints one JSON object: ``params``, ``flops`` (one image), ``knn_top1``/``knn_top5`` (weighted
k-NN), ``linear_top1`` (linear probe on the same features), ``head_top1`` (the model's own
classifier, no retraining), ``seg_miou``/``seg_pixel_accuracy`` (linear probe on patch tokens),
``throughput_images_per_s``, plus the settings and per-stage timings. Errors the user can fix
print one ``error:`` line and exit with status 2; ``--verbose`` shows the traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from torch import nn

from .errors import ConfigError, SnapViTError, exit_with_error
from .eval.suite import DEFAULT_METRICS, METRICS, build_data, evaluate_model, parse_metrics

def spec_from_config(path: str | Path):
    """The dense model of a ``prune.py`` / ``train.py`` YAML (its ``model:`` section) as a ``BackboneSpec``."""
    import yaml

    from .models import BackboneSpec

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}; pass a prune.py / train.py YAML such as configs/prune/demo.yaml")
    try:
        model = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
    except (yaml.YAMLError, AttributeError) as err:
        raise ConfigError(f"{path} is not a YAML mapping ({err})") from err
    if not model.get("model_name"):
        raise ConfigError(f"{path} has no model.model_name; use --checkpoint for a pruned model or --model NAME")
    return BackboneSpec(model["model_name"], bool(model.get("pretrained", False)), model.get("checkpoint_path"),
                        dict(model.get("model_kwargs") or {}))


def load_model(checkpoint: Optional[str | Path] = None, spec=None) -> tuple[nn.Module, dict[str, Any]]:
    """A pruned checkpoint directory (``load_pruned``) or a dense ``BackboneSpec``, and a JSON description."""
    from .models import load_backbone, load_pruned

    if (checkpoint is None) == (spec is None):
        raise ConfigError("give exactly one model: --checkpoint DIR, --config YAML or --model NAME")
    if checkpoint is not None:
        model, record = load_pruned(checkpoint)
        return model, {"checkpoint": str(checkpoint), "base_model": record["base"]["model_name"],
                       "heads": record["heads"], "mlp_hidden": record["mlp_hidden"]}
    return load_backbone(spec), {"dense": spec.to_dict()}


def _count(text: str) -> Optional[int]:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0 (0: the whole split)")
    return value or None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m snapvit_pl.evaluate", description=__doc__.splitlines()[0])
    model = parser.add_argument_group("model (give one of --checkpoint, --config, --model)")
    model.add_argument("--checkpoint", help="pruned (or dense) checkpoint directory written by prune.py / save_pruned")
    model.add_argument("--config", help="evaluate the dense model of a prune.py / train.py YAML (its model: section)")
    model.add_argument("--model", help="dense timm model name, e.g. vit_small_patch16_224.dino")
    model.add_argument("--model-kwargs", default="{}", help="with --model: timm.create_model arguments as JSON")
    model.add_argument("--pretrained", action="store_true", help="with --model: load timm's weights")
    model.add_argument("--weights", help="with --model: a local weights file instead of timm's")
    parser.add_argument("--metrics", default=",".join(DEFAULT_METRICS),
                        help=f"comma-separated subset of {','.join(METRICS)} (default: {','.join(DEFAULT_METRICS)})")
    data = parser.add_argument_group("data")
    data.add_argument("--source", default="fashion_mnist", help="ClassificationDataModule source (default: fashion_mnist)")
    data.add_argument("--root", default="data", help="data root (default: data)")
    data.add_argument("--train-samples", type=_count, default=5000, help="k-NN memory / probe train images (0: all; default 5000)")
    data.add_argument("--val-samples", type=_count, default=2000, help="scored images (0: all; default 2000)")
    data.add_argument("--seg-source", default="fashion_mnist", help="SegmentationDataModule source (default: fashion_mnist)")
    data.add_argument("--seg-root", default=None, help="segmentation data root (default: --root)")
    data.add_argument("--seg-train-samples", type=_count, default=500, help="segmentation probe train images (default 500)")
    data.add_argument("--seg-val-samples", type=_count, default=200, help="segmentation images scored (default 200)")
    data.add_argument("--seed", type=int, default=0, help="seed of the subsets and probes (default 0)")
    data.add_argument("--num-workers", type=int, default=0, help="DataLoader workers (default 0)")
    run = parser.add_argument_group("evaluation")
    run.add_argument("--batch-size", type=int, default=256, help="feature-extraction batch size (default 256)")
    run.add_argument("--throughput-batch", type=int, default=64, help="batch size of the throughput measurement (default 64)")
    run.add_argument("--knn-k", type=int, default=20, help="neighbours of the weighted k-NN (default 20)")
    run.add_argument("--seg-epochs", type=int, default=20, help="segmentation probe epochs (default 20)")
    run.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: CUDA if available)")
    parser.add_argument("--out", help="also write the JSON report to this file (atomically)")
    parser.add_argument("--verbose", action="store_true", help="show the traceback of errors")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status.

    Args:
        argv: arguments without the program name (default: ``sys.argv[1:]``).
    """
    from .io import write_json_atomic
    from .models import BackboneSpec

    args = _parser().parse_args(argv)
    log = lambda message: print(f"[evaluate] {message}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        metrics = parse_metrics(args.metrics)
        if sum(x is not None for x in (args.checkpoint, args.config, args.model)) != 1:
            raise ConfigError("give exactly one model: --checkpoint DIR, --config YAML or --model NAME")
        spec = None
        if args.config is not None:
            spec = spec_from_config(args.config)
        elif args.model is not None:
            try:
                kwargs = json.loads(args.model_kwargs)
            except json.JSONDecodeError as err:
                raise ConfigError(f"--model-kwargs is not JSON ({err}); e.g. '{{\"img_size\": 28, \"in_chans\": 1}}'") from err
            if not isinstance(kwargs, dict):
                raise ConfigError("--model-kwargs must be a JSON object, e.g. '{\"num_classes\": 10}'")
            spec = BackboneSpec(args.model, args.pretrained, args.weights, kwargs)
        started = time.perf_counter()
        model, described = load_model(args.checkpoint, spec)
        data = build_data(model, metrics, args.source, args.root, args.train_samples, args.val_samples, args.batch_size,
                          args.seg_source, args.seg_root, args.seg_train_samples, args.seg_val_samples, args.seed,
                          args.num_workers)
        result = evaluate_model(model, data, metrics, args.knn_k, args.seg_epochs, args.throughput_batch,
                                device=args.device, log=log)
        settings = {k: v for k, v in vars(args).items() if k not in ("checkpoint", "config", "model", "model_kwargs",
                                                                        "pretrained", "weights", "out", "verbose")}
        report = {"model": described, **result, "settings": dict(settings, metrics=metrics),
                  "total_s": round(time.perf_counter() - started, 3)}
        if args.out:
            write_json_atomic(args.out, report)
    except SnapViTError as err:
        return exit_with_error(err, args.verbose)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
