"""``snapvit-pl extract`` / ``python -m snapvit_pl.extract``: pruned models from an elastic-scores file at any
budget, without running the search again.

The base weights are rebuilt from the spec recorded in the scores (timm hub name or local file; ``--model.*``
overrides a field, e.g. ``--model.checkpoint_path`` for a local copy); their fingerprint must match. A cost
budget takes the head/MLP split the pruning run chose for its kept fraction; one the run did not choose is raced
on the run's fitness images as the run would have raced it. Those images are the run's data: ``--config`` of its
``config.yaml``, or, when neither ``--config`` nor ``--data`` is given, the data section of the ``config.yaml``
beside the scores, taken only when the files it names are those the run read (its ``resume_state.pt`` records
them); images given by ``--config`` or ``--data`` are raced on only when they are those files too. Without them (or
with ``--run_data false``) the split is interpolated between the recorded ones and the command says why. The MLP width rounding is the run's unless ``--export.mlp_multiple`` says otherwise.
"""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

from ..io import check_output_dir
from .common import command_parser, run_command, show_declared, writing_to

EPILOG = """examples:
  snapvit-pl extract --scores runs/prune/X/elastic_scores.safetensors --out_dir pruned/ \\
      --export.budgets '[{flops: 0.5}, {params: 2e7}, {mlp_ratio: 0.35, head_ratio: 0.2}]'
  snapvit-pl extract --scores runs/prune/X/elastic_scores.safetensors --out_dir pruned/ \\
      --export.budgets '[{sparsity: 0.45}]' --correction.enabled true   # the run's own images race and calibrate
  snapvit-pl extract --config runs/prune/X/config.yaml --data.init_args.root /mnt/imagenet \\
      --scores runs/prune/X/elastic_scores.safetensors --out_dir pruned/ --export.budgets '[{params: 0.21}]'"""
_SECTIONS = ("scores", "out_dir", "overwrite", "progress", "run_data", "verbose", "model", "export", "correction",
             "data")
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
    parser.add_argument("--run_data", type=bool, default=True,
                        help="without --config or --data, take the images of the run that wrote the scores (the data "
                             "of the config.yaml beside them, when they are the files the run read): a budget's split "
                             "is raced on them as the run would have, and they calibrate the correction; false: "
                             "interpolate the split")
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
    from ..run.lock import DirectoryLock

    parser = build_parser()
    args = parser.parse_args(argv)
    out_dir = check_output_dir(args.out_dir, "--out_dir")
    writing_to(out_dir)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:  # one extract at a time in a folder: another one writing there is refused now, before any work
        with DirectoryLock(out_dir, "--out_dir"):
            return _cut(parser, args, argv, out_dir)
    finally:
        if created and not any(out_dir.iterdir()):  # nothing written (refused, or failed): no empty folder left
            out_dir.rmdir()


def _cut(parser: Any, args: Any, argv: list[str], out_dir: Path) -> int:
    """The models of ``args``' budgets cut from the scores into ``out_dir`` (held by the caller)."""
    from ..correction import CorrectionSettings
    from ..elastic import ElasticScores
    from ..errors import ConfigError
    from ..models import BackboneSpec, load_backbone
    from ..models.cost import macs
    from ..pipeline import DataModuleInputs, Pipeline, PipelineSettings
    from ..run.names import CONFIG_FILE
    from ..run.data import images_the_run_read
    from ..pipeline.settings import ExportSettings
    from ..pipeline.tables import human

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
    base = load_backbone(spec)
    pipeline = Pipeline.from_scores(base, scores, settings, spec=spec, progress=args.progress)
    correction = pipeline.settings.correction
    guessed = [b.label() for b in pipeline.unrecorded(export.budgets)] \
        if pipeline.settings.export.split == "fitness" else []
    data, why_not, race = init.data, "", bool(guessed)
    if data is not None:
        data.configure_for_model(base)
        if guessed:  # images given (--config or --data): raced on only when they are the files the run read
            why_not = images_the_run_read(Path(args.scores).parent, scores, data, pipeline.settings.search.num_images,
                                          "the images --config/--data name")
            race = not why_not
            if race:
                print(f"using the images given, the files the run read: racing the head/MLP split of "
                      f"{', '.join(guessed)}")
    elif guessed or correction.active(base):
        data, why_not = _run_data(argv, args, scores, pipeline.settings.search.num_images)
        if data is not None:
            data.configure_for_model(base)
            print(f"using the run's images ({Path(args.scores).parent / CONFIG_FILE}): "
                  + ", ".join(filter(None, (guessed and f"racing the head/MLP split of {', '.join(guessed)}",
                                            correction.active(base) and "calibrating the correction"))))
        race = data is not None
    if correction.enabled is True and data is None:
        raise ConfigError(f"--correction.enabled true needs calibration images, and the run's could not be taken "
                          f"({why_not}): give the pruning run's data (--config runs/prune/<run>/config.yaml, or "
                          "--data.class_path / --data.init_args.*)")
    if correction.enabled == "auto":  # a model with a classifier, and only with the run's data
        correction.enabled = data is not None and correction.active(base)
    if data is not None:  # calibration, and the fitness that races a budget's split when they are the run's images
        pipeline.inputs = DataModuleInputs(data, fitness=race)
    if guessed and not race:
        print(f"note: the run did not choose the head/MLP split of {', '.join(guessed)}: interpolated between the "
              f"splits it chose, which can cost accuracy (docs/pruning.md), because {why_not}; give the run's data "
              "(--config runs/prune/<run>/config.yaml) to race it as the run would have")
    cost = pipeline.cost
    for item in pipeline.export(models_dir=out_dir, overwrite=args.overwrite, evaluate_dense=False):
        latency = "" if item.latency_ms is None else \
            f", {item.latency_ms:.2f} ms measured ({item.predicted_latency_ms:.2f} predicted)"
        print(f"{item.checkpoint}: mlp_ratio {item.mlp_ratio:.3f}, head_ratio {item.head_ratio:.3f}, "
              f"{item.params / cost.dense_params:.1%} params, {item.flops / cost.dense_flops:.1%} FLOPs "
              f"({human(item.flops)} FLOPs = {human(macs(item.flops))} multiply-accumulates){latency}")
    return 0


def _run_data(argv: list[str], args: Any, scores: Any, num_images: int) -> tuple[Any, str]:
    """The DataModule of the run that wrote ``scores`` (:func:`snapvit_pl.run.data.run_data`: the data
    section of the ``config.yaml`` beside them, when its images are the files the run read), or None and why not;
    none with ``--run_data false`` or when a ``--config`` or ``--data`` option is given."""
    from ..run.data import run_data

    if not args.run_data:
        return None, "--run_data false"
    if any(arg in ("--config", "-c") or arg.startswith(("--config=", "--data")) for arg in argv):
        return None, "the options given name no data"
    found = run_data(Path(args.scores).parent, scores, num_images)
    return found.datamodule, found.why_not
