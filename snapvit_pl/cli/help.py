"""``python prune.py --help``: the options people change first (one line each, with the values of the config in
effect), then every option; printed in well under a second, without importing torch or Lightning.

The full list and the code's defaults come from ``prune_options.json``, rendered from ``prune.py``'s own parser
(LightningCLI's, the Trainer's options included) by::

    python -m snapvit_pl.cli.options      # after changing an option, a default or its docstring

``tests/cli/test_help.py`` fails when the file and the parser disagree.
"""
from __future__ import annotations

import json
import re
import textwrap
import typing
from pathlib import Path
from typing import Any, Optional, Sequence

from ..config_files import config_label
from .preflight import settings_in_effect

OPTIONS_FILE = Path(__file__).with_name("prune_options.json")
WIDTH = 100

#: The first screen: (heading, [(key, metavar, what it is)]), each option on one line with its value.
FIRST_SCREEN: tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...] = (
    ("model", (
        ("model.model_name", "NAME", "timm name with tag, or hf-hub:org/name"),
        ("model.pretrained", "BOOL", "Hub weights; false: random, seeded"),
        ("model.checkpoint_path", "FILE", "a local weights file instead of the Hub's"),
    )),
    ("data: the pruning images (the evaluation reads the same data)", (
        ("data.init_args.source", "NAME", "folder, fashion_mnist, cifar10, ..."),
        ("data.init_args.root", "DIR", "the images (documentation: Data, layouts)"),
        ("data.init_args.max_samples", "N", "pruning images (seeded, class-balanced)"),
        ("data.init_args.batch_size", "N", "images per batch of the importance pass"),
        ("data.init_args.num_workers", "N", "loader processes (at most the CPU cores)"),
        ("search.num_images", "N", "images that choose each head/MLP split"),
    )),
    ("budgets and outputs", (
        ("export.budgets", "LIST", "e.g. '[{flops: 0.5}, {sparsity: 0.4}]'"),
        ("out_dir", "DIR", "run directory (default: runs/prune/<time>)"),
        ("correction.enabled", "BOOL|auto", "weight correction (auto: with a head)"),
    )),
    ("evaluation of the dense and every pruned model", (
        ("evaluation.metrics", "LIST", "knn, linear, head, seg, throughput, []"),
        ("evaluation.train_samples", "N", "train images: k-NN memory, probe training"),
        ("evaluation.val_samples", "N", "val images scored"),
        ("seg_data", "CLASS", "segmentation data for 'seg' (mIoU)"),
    )),
    ("devices", (
        ("trainer.accelerator", "NAME", "cpu, gpu, auto"),
        ("trainer.devices", "N", "devices; several: the pruning DDP"),
        ("trainer.num_nodes", "N", "machines (started by torchrun or SLURM)"),
    )),
    ("the run", (
        ("config", "FILE|NAME", "YAML file or preset (dino_vitb16, quick)"),
        ("resume", "RUN_DIR", "continue an interrupted run"),
        ("overwrite", "BOOL", "replace earlier results in out_dir"),
        ("progress", "MODE", "auto, bar, lines (for logs), off"),
        ("print_config", "", "print the resolved configuration, exit"),
        ("verbose", "BOOL", "show the traceback of errors"),
    )),
)
FIRST_SCREEN_KEYS = tuple(key for _, options in FIRST_SCREEN for key, _, _ in options)


def load_options() -> dict[str, Any]:
    """The rendered option list, the option keys and the first screen's defaults (``prune_options.json``)."""
    return json.loads(OPTIONS_FILE.read_text())


def _shown(value: Any, width: int) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, (list, tuple, dict)):
        text = json.dumps(value, separators=(", ", ": ")).replace('"', "")
    else:
        text = str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def first_screen(argv: Sequence[str], default_config: Path, usage: str, description: str, epilog: str) -> str:
    """The help's first screen: usage, the options most runs change with the values ``argv`` would run with (its
    ``--config`` files, else ``default_config``, and its options; the code's defaults for the rest), examples."""
    defaults = load_options()["defaults"]
    values = settings_in_effect(argv, default_config)
    configs = [a for i, a in enumerate(argv) if i > 0 and argv[i - 1] in ("--config", "-c")] + \
        [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    source = ", ".join(map(config_label, configs)) if configs else f"{config_label(str(default_config))} (the default)"
    lines = textwrap.wrap(f"usage: {usage}", WIDTH, subsequent_indent="    ", break_on_hyphens=False)
    lines += ["", description, "", *textwrap.wrap(f"The options most runs change, with the values of {source} and "
                                                  "the command line:", WIDTH)]
    for heading, options in FIRST_SCREEN:
        lines.append(f"{heading}:")
        for key, metavar, text in options:
            if key == "seg_data":
                value = values.get("seg_data.class_path", values.get("seg_data", defaults.get(key)))
            else:
                value = values.get(key, defaults.get(key))
            shown = "" if key in ("config", "print_config") else _shown(value, 26)
            lines.append(f"  --{key:<26} {shown:<26} {text}".rstrip())
    lines += ["", epilog, "", "All options (the code's defaults; a --config file overrides them):", ""]
    return "\n".join(lines)


def prune_help(argv: Sequence[str], default_config: Path, usage: str, description: str, epilog: str) -> str:
    """``prune.py --help``: :func:`first_screen`, then every option."""
    return first_screen(argv, default_config, usage, description, epilog) + load_options()["text"]


#: --config's help line: a file or a shipped preset's name (snapvit_pl.config_files.resolve_config).
CONFIG_HELP = ("a YAML file of these options (repeatable, the last wins), or the name of a shipped preset: "
               "configs/prune/NAME.yaml, found from any directory (e.g. --config dino_vitb16 --config quick)")

#: seed_everything's help line: the seed policy (snapvit_pl.seeding), not Lightning's generic text.
SEED_HELP = ("the root seed (true: a random one, false: none); every seed left unset (data.init_args.seed, "
             "importance.scorer.init_args.seed, search.seed, model.seed) takes its value, one given is kept")


# -- rendering the full list from the parser (python -m snapvit_pl.cli.options) --------------------------------------
_SKIPPED_ACTIONS = ("_HelpAction", "_ActionConfigLoad", "_ActionHelpClassPath", "_ActionPrintConfig", "ActionLink")


def _plain(text: str) -> str:
    """Docstring markup as plain text: ``x`` and :class:`x` -> x."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text or "")
    return " ".join(text.replace("``", "").split())


def _metavar(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Annotated:  # a declared range (snapvit_pl.ranges): the number's own kind
        from ..ranges import Choices  # declared choices: a word (which, the entry's parentheses say)

        return "WORD" if any(isinstance(meta, Choices) for meta in hint.__metadata__) else \
            _metavar(typing.get_args(hint)[0])
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return _metavar(inner[0]) if len(inner) == 1 else "|".join(_metavar(a) for a in inner)
    if origin is typing.Literal:
        return "{" + ",".join(str(a) for a in args) + "}"
    if origin in (list, tuple) or hint in (list, tuple):
        return "LIST"
    if origin is dict or hint is dict:
        return "MAP"
    if isinstance(hint, type):
        if issubclass(hint, bool):
            return "BOOL"
        if issubclass(hint, int):
            return "N"
        if issubclass(hint, float):
            return "X"
        if issubclass(hint, str):
            return "TEXT"
        return "CLASS"
    return "VALUE"


def _kind(hint: Any) -> Any:
    """What :func:`snapvit_pl.cli.preflight.check_option_values` checks of an option's value: ``"int"``,
    ``"float"``, ``"bool"`` or a list of choices, with ``"?"`` appended (a string; a list gets ``None``) when
    null is allowed; None for anything else (lists, mappings, classes, unions)."""
    optional = False
    if typing.get_origin(hint) is typing.Union:
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) != 1:
            return None
        hint, optional = inner[0], True
    if typing.get_origin(hint) is typing.Annotated:  # a declared range: the number's own kind
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) is typing.Literal:
        return [*typing.get_args(hint), *([None] if optional else [])]
    for name, kind in (("bool", bool), ("int", int), ("float", float)):
        if isinstance(hint, type) and issubclass(hint, kind):
            return name + ("?" if optional else "")
    return None


def _entry(key: str, hint: Any, default: Any, help_text: str) -> list[str]:
    from ..ranges import describe_range, range_types

    metavar = _metavar(hint)
    ranges = "".join(f"; {describe_range(kind)}" for kind in range_types(hint))  # the declared range (snapvit_pl.ranges)
    if ranges and typing.get_origin(hint) is typing.Union and type(None) in typing.get_args(hint):
        ranges += " or null"
    head = f"  --{key} {metavar if len(metavar) <= 24 else 'VALUE'}  (default: {_shown(default, 50)}{ranges})"
    body = textwrap.wrap(_plain(help_text), WIDTH - 6, initial_indent="      ", subsequent_indent="      ")
    return [head, *body]


def _class_entries(cls: type, prefix: str, skip: Sequence[str] = ()) -> list[str]:
    """One entry per constructor argument of ``cls`` (its docstring's text where the signature has none)."""
    import docstring_parser

    documented = {}
    for klass in cls.__mro__:
        for param in docstring_parser.parse(klass.__doc__ or "").params:
            for name in param.arg_name.replace(" ", "").split(","):
                documented.setdefault(name, param.description or "")
    from ..ranges import declared_hints

    declared = declared_hints(cls, prefix)
    lines = []
    for action in _parser_of(cls, prefix)._actions:
        name = action.dest[len(prefix) + 1:]
        if type(action).__name__ in _SKIPPED_ACTIONS or not action.dest.startswith(prefix + ".") or name in skip:
            continue
        lines += _entry(action.dest, declared.get(action.dest, getattr(action, "_typehint", None)), action.default,
                        action.help or documented.get(name, ""))
    return lines


def render_options(parser: Any, declared: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """What ``prune_options.json`` holds, rendered from ``prune.py``'s parser (:func:`snapvit_pl.cli.prune.prune_parser`):
    the option list as text, every option key, and the code's defaults of the first screen's options. ``declared``:
    the options' annotations with their ranges (:func:`snapvit_pl.cli.prune.declared_option_hints`; the parser's own
    copies have lost them), shown with each option."""
    from ..data import ClassificationDataModule
    from ..scoring import DEFAULT_SCORER

    declared = declared or {}
    lines: list[str] = []
    keys: list[str] = []
    kinds: dict[str, Any] = {}
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if type(a).__name__ not in _SKIPPED_ACTIONS]
        if not actions:
            continue
        title = group.title if group.title not in ("options", None) else "the run"
        lines += ["", *textwrap.wrap(f"{title}:", WIDTH)]
        for action in actions:
            keys.append(action.dest)
            kind = _kind(getattr(action, "_typehint", None))
            if kind is not None and not action.dest.startswith("trainer."):
                kinds[action.dest] = kind
            lines += _entry(action.dest, declared.get(action.dest, getattr(action, "_typehint", None)), action.default,
                            {"seed_everything": SEED_HELP, "config": CONFIG_HELP}.get(action.dest, action.help))
            if action.dest == "importance.scorer":
                lines += [f"    {DEFAULT_SCORER.__name__}'s arguments (--importance.scorer.help CLASS: another's):"]
                lines += _class_entries(DEFAULT_SCORER, "importance.scorer.init_args")
            if action.dest == "data":
                lines += [f"    {ClassificationDataModule.__name__}'s arguments (--data.help CLASS: another's):"]
                lines += _class_entries(ClassificationDataModule, "data.init_args", skip=("model_name",))
    data_defaults = {a.dest: a.default for a in _parser_of(ClassificationDataModule, "data.init_args")._actions}
    defaults = {a.dest: a.default for a in parser._actions}
    first = {key: _jsonable(defaults.get(key, data_defaults.get(key))) for key in FIRST_SCREEN_KEYS}
    first["seg_data"] = first.get("seg_data") or None
    return {"generated_by": "python -m snapvit_pl.cli.options", "options": sorted(keys), "kinds": kinds,
            "defaults": first,
            "text": "\n".join(lines[1:]) + "\n"}


def _parser_of(cls: type, prefix: str) -> Any:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(cls, prefix)
    return parser


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value if isinstance(value, (str, int, float, bool, list, dict, type(None))) else None
