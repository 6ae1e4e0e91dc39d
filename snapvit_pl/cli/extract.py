"""``snapvit-pl extract`` / ``python -m snapvit_pl.extract``: pruned models from an elastic-scores file at any
budget, without running the search again.

The base weights are rebuilt from the spec recorded in the scores (timm hub name or local file; ``--model.*``
overrides a field, e.g. ``--model.checkpoint_path`` for a local copy); their fingerprint must match. A cost
budget takes the head/MLP split the pruning run chose for its kept fraction (interpolated between the
recorded ones, or raced on the run's fitness images as the run would have raced it when the run's data is given:
``--config`` of its ``config.yaml``); the MLP width rounding is the run's unless ``--export.mlp_multiple`` says
otherwise.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Optional

from .common import check_output_dir, command_parser, run_command, show_declared, writing_to

EPILOG = """examples:
  snapvit-pl extract --scores runs/prune/X/elastic_scores.safetensors --out_dir pruned/ \\
      --export.budgets '[{flops: 0.5}, {params: 2e7}, {mlp_ratio: 0.35, head_ratio: 0.2}]'
  snapvit-pl extract --config runs/prune/X/config.yaml --scores runs/prune/X/elastic_scores.safetensors \\
      --out_dir pruned/ --export.budgets '[{sparsity: 0.45}]' --correction.enabled true   # the run's data calibrates"""
_SECTIONS = ("scores", "out_dir", "overwrite", "progress", "verbose", "model", "export", "correction", "data")
_EXPORT_FIELDS = ("budgets", "latency_batch_size", "latency_device", "latency_table")


def build_parser():
    """The ``extract`` command's parser."""
    from ..correction import CorrectionSettings
    from ..data import VisionDataModule
    from ..pipeline.settings import ExportSettings
    from ..progress import MODES
    from ..ranges import declared_hints

    parser = command_parser("snapvit-pl extract", __doc__, _SECTIONS, EPILOG)
    parser.add_argument("--scores", type=str, required=True, help="elastic_scores.safetensors written by prune.py")
    parser.add_argument("--out_dir", type=str, required=True, help="directory receiving one model per budget")
    parser.add_argument("--overwrite", type=bool, default=False, help="replace models already in out_dir")
    parser.add_argument("--progress", type=str, default="auto", help=f"{', '.join(MODES)}")
    for key, kind in (("model_name", Optional[str]), ("pretrained", Optional[bool]), ("checkpoint_path", Optional[str]),
                      ("model_kwargs", Optional[dict[str, Any]]), ("seed", Optional[int])):
        parser.add_argument(f"--model.{key}", type=kind, default=None,
                            help="overrides this field of the base model recorded in the scores")
    parser.add_class_arguments(ExportSettings, "export", skip={f.name for f in fields(ExportSettings)
                                                                if f.name not in _EXPORT_FIELDS})
    parser.add_argument("--export.mlp_multiple", type=Optional[int], default=None,
                        help="round MLP widths to this multiple (default: the pruning run's)")
    parser.add_class_arguments(CorrectionSettings, "correction")
    parser.add_subclass_arguments(VisionDataModule, "data", required=False, default=None,
                                  help="calibration images of the correction (the pruning run's data)")
    show_declared(parser, {**declared_hints(ExportSettings, "export"), **declared_hints(CorrectionSettings, "correction")})
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    return run_command(_extract, argv, "snapvit-pl extract",
                       batch_options=("--correction.batch_size", "--export.latency_batch_size"))


def _extract(argv: list[str]) -> int:
    from ..correction import CorrectionSettings
    from ..elastic import ElasticScores
    from ..errors import ConfigError
    from ..models import BackboneSpec, load_backbone
    from ..pipeline import DataModuleInputs, Pipeline, PipelineSettings
    from ..pipeline.settings import ExportSettings
    from ..models.cost import macs
    from ..pipeline.tables import human

    parser = build_parser()
    args = parser.parse_args(argv)
    out_dir = check_output_dir(args.out_dir, "--out_dir")
    writing_to(out_dir)
    init = parser.instantiate(args, instantiate_groups=False)  # the data module; the settings are built below
    scores = ElasticScores.load(args.scores)
    if not scores.base.get("model_name") and not args.model.model_name:
        raise ConfigError(f"{args.scores} does not record how to build its base model (scores from fit_elastic "
                          "without spec=); give --model.model_name (and --model.checkpoint_path), or cut models in "
                          "Python with scores.extract(model, ...)")
    recorded = scores.base or {"model_name": args.model.model_name}
    # an override is a value given, or a null given on the command line (--model.checkpoint_path null: no file)
    nulls = {key for key, value in dict(args.model.items()).items() if value is None and any(
        arg == f"--model.{key}" or arg.startswith(f"--model.{key}=") for arg in argv)}
    overrides = {k: v for k, v in dict(args.model.items()).items() if v is not None or k in nulls}
    spec = BackboneSpec.from_dict({**recorded, **overrides}, f"{args.scores} (with the --model overrides)")
    multiple = scores.mlp_multiple if args.export.mlp_multiple is None else args.export.mlp_multiple  # 0: refused
    export = ExportSettings(**{k: args.export[k] for k in _EXPORT_FIELDS}, mlp_multiple=multiple)
    if export.latency_table is None:
        export.latency_table = str(out_dir / "latency_table.json")
    settings = PipelineSettings(export=export, correction=CorrectionSettings(**args.correction.as_dict()))
    settings.evaluation.metrics = []
    if settings.correction.enabled is True and init.data is None:
        raise ConfigError("--correction.enabled true needs calibration images: give the pruning run's data "
                          "(--config runs/prune/<run>/config.yaml, or --data.class_path / --data.init_args.*)")
    base = load_backbone(spec)
    if settings.correction.enabled == "auto":  # where the model computes, and only with the run's data
        settings.correction.enabled = init.data is not None and settings.correction.active(next(base.parameters()).device)
    inputs = None
    if init.data is not None:  # the run's images: calibration, and the fitness that races a budget's split
        inputs = DataModuleInputs(init.data)
        init.data.configure_for_model(base)
    pipeline = Pipeline.from_scores(base, scores, settings, spec=spec, inputs=inputs, progress=args.progress)
    cost = pipeline.cost
    guessed = [b.label() for b in pipeline.unrecorded(export.budgets)]
    if guessed and inputs is None and pipeline.settings.export.split == "fitness":
        print(f"note: the run did not choose the head/MLP split of {', '.join(guessed)}: interpolated between the "
              "splits it chose; give the run's data (--config runs/prune/<run>/config.yaml) to race it as the run "
              "would have")
    for item in pipeline.export(models_dir=out_dir, overwrite=args.overwrite, evaluate_dense=False):
        latency = "" if item.latency_ms is None else \
            f", {item.latency_ms:.2f} ms measured ({item.predicted_latency_ms:.2f} predicted)"
        print(f"{item.checkpoint}: mlp_ratio {item.mlp_ratio:.3f}, head_ratio {item.head_ratio:.3f}, "
              f"{item.params / cost.dense_params:.1%} params, {item.flops / cost.dense_flops:.1%} FLOPs "
              f"({human(item.flops)} FLOPs = {human(macs(item.flops))} multiply-accumulates){latency}")
    return 0
