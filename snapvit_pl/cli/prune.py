"""``prune.py`` / ``snapvit-pl prune``: LightningCLI over a :class:`PruningModule` and the stage callbacks."""
from __future__ import annotations

import logging
import os
import re
import signal
import sys
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError
from ..lightning.trainer_policy import check_options, lightning_information
from ..config_files import DEFAULT_PRUNE_CONFIG, check_config_files, layered_parser
from ..progress import MODES, resolve_mode
from ..run.folder import FolderHints, RunFolder, check_run_folder, resumable
from ..run.launch import RUN_DIR_ENV, check_launch, first_process, shared_run_dir
from ..run.names import SCORES_FILE
from ..seeding import derive_seeds, root_seed
from ..io import check_output_dir
from .common import help_formatter, program, remember_parser, run_command, tensorboard_logger, writing_to

#: What to lower when a run runs out of memory.
BATCH_OPTIONS = ("--data.init_args.batch_size", "--search.batch_size", "--evaluation.batch_size", "--correction.batch_size")
PRUNE_USAGE = ("python prune.py [--config FILE] [--GROUP.KEY VALUE ...] [--out_dir DIR] [--resume RUN_DIR] "
               "[--progress MODE] [--verbose true]")
PRUNE_DESCRIPTION = ("Prune a pretrained ViT into an elastic family of sub-networks (SnapViT):\n"
                     "local importance, coefficient search, pruned models at budgets, report.")
PRUNE_EPILOG = """examples:
  python prune.py                                       # the offline demo (configs/prune/demo.yaml)
  python prune.py --config configs/prune/dino_vitb16.yaml --data.init_args.root /data/imagenet
  python prune.py --config configs/prune/dino_vitb16.yaml --config configs/prune/quick.yaml
                                                        # the same, in minutes on a CPU
  python prune.py --search.max_time 60 --export.budgets '[{sparsity: 0.5}, {flops: 0.4}]'
  python prune.py --resume runs/prune/20261201-101500   # continue an interrupted run
Every option can also be set in a YAML file (--config; --print_config shows the resolved one).
The Lightning Trainer's own options (--trainer.*) are listed last."""
_OWN_GROUPS = ("importance", "search", "export", "correction", "evaluation", "report", "model", "data", "seg_data")


def settings_groups() -> dict[str, type]:
    """The pipeline's settings groups (``importance``, ``search``, ...) and their dataclasses, in stage order."""
    from ..pipeline.settings import PipelineSettings

    hints = typing.get_type_hints(PipelineSettings)
    return {f.name: hints[f.name] for f in fields(PipelineSettings)}


def declared_option_hints() -> dict[str, Any]:
    """The annotations of the options the settings groups and the model declare, with their ranges
    (``{"search.sigma": PositiveFloat, ...}``): what ``--help`` shows; the parser reads them without the ranges, which
    the settings check as they are built (:mod:`snapvit_pl.ranges`)."""
    from ..lightning.pruning_module import PruningModule
    from ..ranges import declared_hints

    hints = declared_hints(PruningModule, "model")
    for group, settings in settings_groups().items():
        hints.update(declared_hints(settings, group))
    return hints


def check_before_imports(argv: list[str]) -> None:
    """What ``argv`` (its configs and options) can be refused for before torch is imported: an unknown option, a
    value of the wrong kind, a missing weights file or data root (:mod:`.preflight`). The progress mode and the run
    directory are checked once, after the parse and before the model is built (``before_instantiate_classes``)."""
    from .help import load_options
    from .preflight import check_inputs, check_option_names, check_option_values, given_settings

    keys, values = given_settings(argv)
    known = load_options()
    arguments = {}  # the default data class's arguments, as its help lists them (another class: its parser checks)
    if str(values.get("data.class_path") or "ClassificationDataModule").split(".")[-1] == "ClassificationDataModule":
        arguments["data.init_args."] = re.findall(r"^  --(data\.init_args\.\w+) ", known["text"], re.M)
    check_option_names(keys, known["options"], program("prune"), arguments)
    check_option_values(values, known["kinds"], program("prune"))
    check_inputs(values)


def check_run_dir(out_dir: Path, overwrite: bool, scores_file: str = SCORES_FILE) -> None:
    """Refuse a run directory that cannot be one, or one :func:`snapvit_pl.run.folder.check_run_folder` refuses (in use,
    or holding what a run would replace, unless ``overwrite``). The processes a multi-process run starts after the
    first skip the second part: the first has begun writing there."""
    check_output_dir(out_dir, "--out_dir")
    if first_process():
        check_run_folder(out_dir, overwrite, scores_file, hints=cli_hints())


def cli_hints() -> FolderHints:
    """How ``prune.py``'s refusals name the ways out of a run folder it cannot use."""
    return FolderHints("--out_dir", "pass --overwrite true", f"{program('prune')} --resume {{folder}}")


def check_trainer_options(trainer: Any, defaults: Any) -> None:
    """Refuse a ``--trainer`` option the run cannot honour (:mod:`snapvit_pl.lightning.trainer_policy`, the same
    rule as a composed Trainer's) and a device or node count that cannot launch.

    Raises:
        ConfigError: one line naming the option.
    """
    check_options(dict(sorted(dict(trainer.items()).items())), defaults, cli=True)
    from ..lightning.pruning_module import check_precision

    check_precision(trainer.get("precision"))  # here, before any process starts: refused once, not once per process
    check_launch(trainer)


class _ParserBuilt(Exception):
    def __init__(self, parser: Any):
        super().__init__("parser built")
        self.parser = parser


def prune_parser() -> Any:
    """``prune.py``'s parser as built (its options and the code's defaults), given nothing to parse: what the
    full option list of ``--help`` is made from (:mod:`snapvit_pl.cli.help`)."""
    try:
        prune_cli([], build_only=True)
    except _ParserBuilt as built:
        return built.parser
    raise RuntimeError("prune_cli(build_only=True) returned without its parser")


def prune_cli(argv: list[str], resume_dir: Optional[Path] = None, build_only: bool = False):
    """``prune.py``'s LightningCLI, parsed and instantiated but not run.

    ``cli.model`` (the :class:`PruningModule`, its ``pipeline`` configured with the stage settings),
    ``cli.datamodule`` and ``cli.trainer`` are what a ``python prune.py <argv>`` run uses; the benchmarks read
    their settings from here (``cli.model.pipeline.settings``).

    Args:
        argv: the command-line arguments.
        resume_dir: the interrupted run ``argv`` resumes (its saved settings may not change).
        build_only: stop once the parser is built (:func:`prune_parser`).
    """
    from pytorch_lightning.cli import LightningCLI

    from ..callbacks import STAGE_CALLBACKS
    from ..data import SegmentationDataModule, VisionDataModule
    from ..lightning.pruning_module import PruningModule
    from ..lightning.strategy import pruning_strategy
    from ..lightning.trainer_policy import PRUNING_TRAINER_DEFAULTS
    from ..run.names import CONFIG_FILE
    from ..run.resume import check_unchanged
    from ..pipeline.settings import PipelineSettings

    groups = settings_groups()
    lightning_information(logging.WARNING)  # a pruning run prints its own progress only

    class PruneCLI(LightningCLI):
        def init_parser(self, **kwargs: Any) -> Any:
            return remember_parser(layered_parser(self.parser_class, **kwargs))  # a config's base: files first

        def add_arguments_to_parser(self, parser) -> None:
            parser.add_argument("--out_dir", type=Optional[str], default=None,
                                help="run directory (default: runs/prune/<timestamp>)")
            parser.add_argument("--overwrite", type=bool, default=False,
                                help="replace the results of an earlier run in out_dir")
            parser.add_argument("--resume", type=Optional[str], default=None,
                                help="continue the interrupted run in this directory (its config.yaml, its progress)")
            parser.add_argument("--progress", type=str, default="auto",
                                help=f"{', '.join(MODES)}: bars in a terminal, log lines in a log file or a pipe (auto)")
            parser.add_argument("--verbose", type=bool, default=False,
                                help="show the traceback of errors (or set SNAPVIT_VERBOSE=1)")
            for key, settings in groups.items():  # one group per stage (snapvit_pl.pipeline.PipelineSettings)
                parser.add_class_arguments(settings, key)
            parser.add_subclass_arguments(
                SegmentationDataModule, "seg_data", required=False,
                help="segmentation data of the seg metric (a linear probe's mIoU on each model's patch tokens), e.g. "
                     "--seg_data SegmentationDataModule --seg_data.init_args.source fashion_mnist (offline canvases)")
            parser.link_arguments("model.model_name", "data.init_args.model_name")
            # --help: the project's options first, then its stage groups, the model and data; the trainer last
            own = [parser.groups[key] for key in _OWN_GROUPS if key in parser.groups]
            trainer = [parser.groups["trainer"]] if "trainer" in parser.groups else []
            rest = [g for g in parser._action_groups if g not in own and g not in trainer]  # argparse's print order
            parser._action_groups[:] = rest + own + trainer
            parser.set_defaults({f"trainer.{key}": value for key, value in PRUNING_TRAINER_DEFAULTS.items()})

        def parse_arguments(self, parser, args) -> None:
            if build_only:
                raise _ParserBuilt(parser)
            super().parse_arguments(parser, args)
            # a random seed drawn here and recorded (Lightning would use 0); checked before Lightning seeds with it
            self.config.seed_everything = root_seed(self.config.seed_everything)

        def before_instantiate_classes(self) -> None:
            config = self.config
            self.progress = resolve_mode(config.progress)  # the one check of --progress (the pipeline takes it as is)
            check_trainer_options(config.trainer, self.parser.get_defaults().trainer)
            derive_seeds(config)
            if resume_dir is not None:  # both read by this parser: --data.root and --data.init_args.root are one key
                saved = self.parser.parse_args(["--config", str(resume_dir / CONFIG_FILE)])
                check_unchanged(dict(saved.items()), dict(config.items()))
            trainer = config.trainer
            out_dir = Path(config.out_dir or shared_run_dir(trainer.num_nodes))
            check_run_dir(out_dir, config.overwrite, config.export.scores_file)
            config.out_dir = str(out_dir)
            trainer.default_root_dir = str(out_dir)
            if trainer.logger in (None, True):
                trainer.logger = tensorboard_logger(out_dir, default_hp_metric=False)

        def instantiate_trainer(self, **kwargs):
            c = self.config_init
            # the strategy resolved for this launch, not written into the run's config: a resume (in any process
            # count) resolves it again from what the user asked
            t = c.trainer
            kwargs["strategy"] = pruning_strategy(t.strategy, t.accelerator, t.devices, t.num_nodes)
            trainer = build_trainer(super().instantiate_trainer, **kwargs)
            settings = PipelineSettings(**{key: c[key] for key in groups})
            self.model.configure_pipeline(settings, run_dir=c.out_dir, progress=self.progress, seg_data=c.get("seg_data"))
            trainer.callbacks[:0] = [callback() for callback in STAGE_CALLBACKS]  # in the pipeline's stage order
            return trainer

    return PruneCLI(
        PruningModule, VisionDataModule, subclass_mode_data=True, run=False, args=argv, seed_everything_default=0,
        save_config_callback=None,
        parser_kwargs={"description": PRUNE_DESCRIPTION,
                       "usage": PRUNE_USAGE, "epilog": PRUNE_EPILOG, "formatter_class": help_formatter(),
                       "exit_on_error": False},
        trainer_defaults={}, auto_configure_optimizers=False,
    )


def build_trainer(instantiate: Any, **kwargs: Any) -> Any:
    """Lightning's Trainer; what it refuses (an accelerator that is not here, a strategy that does not fit it) is one
    line naming the ``--trainer`` options."""
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    try:
        return instantiate(**kwargs)
    except (MisconfigurationException, ValueError, RuntimeError, TypeError) as err:
        message = " ".join(str(err).split())
        if "backend found" in message or "not available" in message or "no GPU" in message:
            message = f"the accelerator asked for is not on this machine ({message})"
        raise ConfigError(f"--trainer: {message}; check --trainer.accelerator, --trainer.devices and "
                          f"--trainer.strategy ({program('prune')} --help)") from err


def _resume_args(argv: list[str]) -> tuple[list[str], Optional[Path]]:
    """``--resume RUN_DIR`` -> the run's saved config and out_dir, then any other overrides."""
    resume = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--resume"), None)
    resume = resume or next((a.split("=", 1)[1] for a in argv if a.startswith("--resume=")), None)
    if resume is None:
        return argv, None
    rest = [a for i, a in enumerate(argv) if a != "--resume" and not a.startswith("--resume=")
            and (i == 0 or argv[i - 1] != "--resume")]
    run_dir = Path(resume)
    return ["--config", str(resumable(run_dir)), *rest, "--out_dir", str(run_dir), "--overwrite", "true"], run_dir


class _Interrupted(KeyboardInterrupt):
    """Raised by the SIGTERM handler so Lightning shuts down as for Ctrl+C."""


def _raise_interrupted(signum: int, frame: object) -> None:
    raise _Interrupted()


def prune_main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``prune.py``; returns the exit status."""
    from ..io import write_text_atomic

    run: dict[str, Any] = {}

    def body(argv: list[str]) -> int:
        check_config_files(argv)
        argv, resume_dir = _resume_args(argv)
        if {"-h", "--help"} & set(argv):  # the values this command would run with, then every option; no torch
            from .help import prune_help

            name = program("prune")
            print(prune_help(argv, DEFAULT_PRUNE_CONFIG, PRUNE_USAGE.replace("python prune.py", name),
                             PRUNE_DESCRIPTION, PRUNE_EPILOG.replace("python prune.py", name)), flush=True)
            return 0
        if not any(a in ("--config", "-c") or a.startswith("--config=") for a in argv):
            argv = ["--config", str(DEFAULT_PRUNE_CONFIG)] + argv
        check_before_imports(argv)  # option names, paths: before torch is imported and any weights are loaded
        from ..lightning.strategy import close_process_group
        from ..pipeline.data_source import record_inputs
        from ..run.resume import load_resume_state

        cli = prune_cli(argv, resume_dir=resume_dir)
        pipeline = cli.model.pipeline
        pipeline.check()  # budgets the keep ratios cannot reach, before anything is written
        record_inputs(pipeline, cli.datamodule)  # what it reads of the data: saved below, or compared by a resume
        out_dir = Path(cli.config.out_dir)
        main_process = cli.trainer.global_rank == 0  # the other DDP processes (and nodes) write nothing
        run["out_dir"] = out_dir
        if main_process:  # one run at a time in a directory; the lock goes with this process
            writing_to(out_dir)
            # the folder becomes this run's (cleanup may then remove what it wrote) only once it holds the lock: a run
            # refused because another holds it leaves the folder and everything in it to that run
            run["folder"] = RunFolder(out_dir, cli.config.overwrite, cli.config.export.scores_file,
                                      resume=resume_dir is not None, hints=cli_hints()).open()
            cli.model.use_run_folder(run["folder"])  # held here: the module does not take it again
        if resume_dir is not None:
            pipeline.load_state_dict(load_resume_state(resume_dir))
        elif main_process:
            write_text_atomic(out_dir / "config.yaml", cli.parser.dump(cli.config, skip_unset=False))
            pipeline.save_progress()
        if main_process:
            # latency budgets: the table measured now, on the run's device; an unreachable one refused now
            pipeline.check_latency(cli.trainer.strategy.root_device)
        previous = signal.signal(signal.SIGTERM, _raise_interrupted)  # restored below: a caller's handler stays its own
        try:
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
            if "folder" in run:
                run.pop("folder").close()
            close_process_group()  # the ranks finish together
        except (KeyboardInterrupt, SystemExit) as err:
            if "folder" in run:
                run.pop("folder").close()
            if isinstance(err, SystemExit) and err.code in (0, None):
                raise
            if finished():  # the report was the last thing to write, and it is written: a signal after it
                print(finished(), file=sys.stderr)
                return 0
            from ..run.names import RESUME_FILE

            if (out_dir / RESUME_FILE).exists():
                print(f"interrupted: progress is saved in {out_dir}; continue with: {program('prune')} --resume "
                      f"{out_dir}", file=sys.stderr)
            else:
                print("interrupted before anything was saved; start the run again", file=sys.stderr)
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)
        return 0

    def finished() -> Optional[str]:
        """The line of a run whose results are all written (its report, the last file, is there: a folder with an
        earlier run's report is refused, or cleared with --overwrite, before a run starts), else None."""
        out_dir = run.get("out_dir")
        if out_dir is None or not (out_dir / "report.json").is_file():
            return None
        return f"finished: every result of the run is written in {out_dir} (the signal came after its end)"

    def cleanup() -> None:  # a run that failed on bad input leaves nothing behind; one that made progress, a resume
        folder = run.pop("folder", None)
        if folder is not None and folder.abandon():  # (None: another run holds the directory, or none was taken)
            print(f"progress is saved in {folder.path}; once fixed, continue with: {program('prune')} --resume "
                  f"{folder.path}", file=sys.stderr)

    chose_run_dir = RUN_DIR_ENV not in os.environ
    try:
        return run_command(body, argv, program("prune"), cleanup, batch_options=BATCH_OPTIONS, finished=finished)
    finally:
        if "folder" in run:  # however the run ended (a bug's traceback included), no lock stays behind
            run.pop("folder").close()
        if chose_run_dir:  # the next run in this process chooses its own
            os.environ.pop(RUN_DIR_ENV, None)
