"""``snapvit-pl evaluate`` / ``python -m snapvit_pl.evaluate``: frozen-feature metrics, size and speed of one
(pruned or dense) ViT.

Prints one JSON object: ``params``, ``flops`` (one image, 2 per multiply-accumulate), ``macs`` (the papers' "FLOPs"), ``knn_top1``/``knn_top5`` (weighted k-NN),
``linear_top1`` (linear probe on the same features), ``head_top1`` (the model's own classifier, no
retraining), ``seg_miou``/``seg_pixel_accuracy`` (linear probe on patch tokens), ``throughput_images_per_s``,
plus the settings and per-stage timings. The model is ``--checkpoint`` (a pruned checkpoint, local or
``hf-hub:``), else the dense model of the ``model`` group. A ``prune.py`` config (``--config``) gives the
model, the data and the evaluation settings of that run; ``--checkpoint`` then evaluates a model it exported.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

from ..io import check_output_file
from .common import command_parser, run_command, writing_to

EPILOG = """examples:
  snapvit-pl evaluate --checkpoint runs/prune/X/models/flops0.5 --evaluation.metrics [knn,linear,head]
  snapvit-pl evaluate --config configs/prune/dino_vitb16.yaml --data.init_args.root /data/imagenet \\
      --checkpoint runs/prune/X/models/flops0.5 --out flops0.5.json
  snapvit-pl evaluate --model.model_name vit_small_patch16_224.dino --model.pretrained true   # the dense model"""
_SECTIONS = ("checkpoint", "model", "data", "seg_data", "evaluation", "device", "out", "overwrite", "verbose")


def build_parser():
    """The ``evaluate`` command's parser."""
    from ..data import SegmentationDataModule, VisionDataModule
    from ..eval.suite import DEFAULT_METRICS, EvaluationSettings

    parser = command_parser("snapvit-pl evaluate", __doc__, _SECTIONS, EPILOG)
    parser.add_argument("--checkpoint", type=Optional[str], default=None,
                        help="pruned checkpoint directory (or hf-hub:org/name) written by prune.py / extract")
    parser.add_argument("--model.model_name", type=Optional[str], default=None,
                        help="without --checkpoint: the dense timm model, e.g. vit_small_patch16_224.dino")
    parser.add_argument("--model.pretrained", type=bool, default=False, help="load timm's weights of the dense model")
    parser.add_argument("--model.checkpoint_path", type=Optional[str], default=None,
                        help="a local weights file of the dense model")
    parser.add_argument("--model.model_kwargs", type=Optional[dict[str, Any]], default=None,
                        help="timm.create_model arguments of the dense model")
    parser.add_argument("--model.seed", type=Optional[int], default=None,
                        help="the seed of its random weights (pretrained false; a prune.py run records it)")
    parser.add_subclass_arguments(VisionDataModule, "data", help="labeled data (k-NN memory, probe, scored split)")
    parser.add_subclass_arguments(SegmentationDataModule, "seg_data", required=False,
                                  help="segmentation data of the seg metric")
    parser.add_class_arguments(EvaluationSettings, "evaluation")
    parser.add_argument("--device", type=Optional[str], default=None,
                        help="cpu, cuda, cuda:1, ... (default: CUDA if available)")
    parser.add_argument("--out", type=Optional[str], default=None, help="also write the JSON report to this file")
    parser.add_argument("--overwrite", type=Optional[bool], default=None,
                        help="replace an existing --out file (default: only a report this command wrote)")
    parser.set_defaults({
        "data": {"class_path": "snapvit_pl.data.ClassificationDataModule", "init_args": {"source": "fashion_mnist"}},
        "seg_data": {"class_path": "snapvit_pl.data.SegmentationDataModule", "init_args": {"source": "fashion_mnist"}},
        "evaluation.metrics": list(DEFAULT_METRICS),
    })
    return parser


#: The keys of every report this command writes (what an existing ``--out`` it may replace holds).
REPORT_KEYS = ("model", "settings", "timings_s", "total_s")


def is_report(path: Path) -> bool:
    """Whether ``path`` holds a report this command wrote (a JSON object with :data:`REPORT_KEYS`)."""
    try:
        data = json.loads(path.read_text()) if path.is_file() and path.stat().st_size < 10_000_000 else None
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and all(key in data for key in REPORT_KEYS)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    return run_command(_evaluate, argv, "snapvit-pl evaluate",
                       batch_options=("--evaluation.batch_size", "--evaluation.throughput_batch_size"))


def _evaluate(argv: list[str]) -> int:
    from ..device import resolve_device
    from ..errors import ConfigError
    from ..eval.suite import EvalData, evaluate_model
    from ..io import write_json_atomic
    from ..models import BackboneSpec, load_backbone, load_pruned

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.device is not None:  # before any data or weights are read
        resolve_device(args.device)
    if args.out is not None:
        check_output_file(args.out, "--out", args.overwrite, ours=is_report)
        writing_to(Path(args.out).parent)
    init = parser.instantiate(args)
    settings = init.evaluation
    log = lambda message: print(f"[evaluate] {message}", file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()
    if args.checkpoint is not None:
        model, record = load_pruned(args.checkpoint)
        described: dict[str, Any] = {"checkpoint": args.checkpoint, "base_model": record["base"]["model_name"],
                                     "heads": record["heads"], "mlp_hidden": record["mlp_hidden"]}
    elif args.model.model_name:
        spec = BackboneSpec(args.model.model_name, args.model.pretrained, args.model.checkpoint_path,
                            dict(args.model.model_kwargs or {}), args.model.seed)
        model, described = load_backbone(spec), {"dense": spec.to_dict()}
    else:
        raise ConfigError("give the model: --checkpoint DIR (a pruned checkpoint) or --model.model_name NAME "
                          "(a dense timm model; a prune.py --config gives one)")
    init.data.configure_for_model(model)
    seg = init.seg_data if "seg" in settings.metrics else None
    if seg is not None:
        seg.configure_for_model(model)
    data = EvalData.from_datamodule(init.data, settings, seg)
    result = evaluate_model(model, data, settings, device=args.device, log=log)
    report = {"model": described, **result,
              "settings": {"evaluation": dict(args.evaluation.items()), "data": args.data.as_dict()},
              "total_s": round(time.perf_counter() - started, 3)}
    if args.out:  # the report in the file; a few lines on the terminal
        write_json_atomic(args.out, report)
        print(summary(report, args.out))
    else:  # the report itself (a pipe's input)
        print(json.dumps(report, indent=2))
    return 0


def summary(report: dict[str, Any], out: str) -> str:
    """What ``evaluate --out FILE`` prints: the model's size and each metric, one line each, and where the report is."""
    lines = [f"params {report['params']:,}, FLOPs {report['flops']:,}"]
    for key, value in report.items():
        if key.endswith(("_top1", "_top5", "_miou", "_pixel_accuracy")) and value is not None:
            lines.append(f"{key} {100 * value:.2f}%")
        elif key == "throughput_images_per_s":
            lines.append(f"throughput {value:,.0f} images/s (batch {report.get('throughput_batch_size')})")
    return "\n".join([*lines, f"wrote {out} (the whole report, {report['total_s']:.1f} s)"])
