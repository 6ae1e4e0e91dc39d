"""The YAML config files of every command: the shipped presets (``configs/<kind>/<name>.yaml``), reading a file once
and strictly (UTF-8, valid YAML, no key twice, no alias bomb, a mapping of settings), a file's ``base:`` configs read
first (:func:`config_layers`), and the ``--config`` actions of the command lines' parsers (:func:`layered_parser`,
:func:`config_action`), built on jsonargparse's public ``ActionConfigFile``."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from .errors import ConfigError
from .io import DATA_ROOT, special_file


#: The shipped presets, ``configs/<kind>/<name>.yaml`` (in the installed package or the checkout: :data:`DATA_ROOT`).
PRESETS_DIR = DATA_ROOT / "configs"


#: The kinds of presets: ``prune`` (prune, extract, evaluate, deploy, hub) and ``train`` (train, pretrain).
PRESET_KINDS = ("prune", "train")


DEFAULT_PRUNE_CONFIG = PRESETS_DIR / "prune" / "demo.yaml"


#: Top-level config sections of the project's commands: a config of one command is readable by the others,
#: each keeping the sections it uses.
PROJECT_SECTIONS = ("model", "data", "seg_data", "importance", "search", "export", "correction", "evaluation",
                    "report", "trainer", "optimizer", "lr_scheduler", "ckpt_path", "seed_everything", "out_dir",
                    "overwrite", "resume", "verbose", "progress", "scores", "checkpoint", "out", "device")


def presets(kind: str = "prune") -> dict[str, Path]:
    """The shipped presets of ``kind`` (:data:`PRESET_KINDS`) by name: ``{"demo": .../configs/prune/demo.yaml, ...}``."""
    return {path.stem: path for path in sorted((PRESETS_DIR / kind).glob("*.yaml"))}


def _yaml_text(value: str) -> bool:
    """Whether a ``--config`` value is YAML text rather than a path (``'{search: {num_images: 8}}'``)."""
    return value.lstrip().startswith(("{", "\n")) or ":" in value


def _exists(path: Path) -> bool:
    """``path.exists()``, False for a value the system cannot take as a path (too long, a NUL byte)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def names_file(value: str) -> bool:
    """Whether a ``--config`` value is the path of an existing file: YAML text never is, nor a value the system
    cannot take as a path (too long, a NUL byte), which ``Path.is_file`` would raise on."""
    try:
        return not _yaml_text(value) and Path(value).is_file()
    except (OSError, ValueError):
        return False


def resolve_config(value: str, kind: str = "prune") -> str:
    """The file a ``--config`` value names, the one place such a value is turned into a path: a path as given
    when it exists (or YAML text, unchanged); a relative path missing from the working directory that the shipped
    data holds (``configs/prune/quick.yaml`` from anywhere); a bare name (``dino_vitb16``, ``quick``, with or
    without ``.yaml``): the shipped preset of ``kind`` (``prune``: ``configs/prune/``, ``train``:
    ``configs/train/``).

    Raises:
        ConfigError: neither a file nor a preset (the line lists the presets).
    """
    path = Path(value)
    if not _yaml_text(value) and special_file(path) is not None:  # reading it could wait for ever
        raise ConfigError(f"--config {value} is {special_file(path)}, not a file; give a YAML file")
    if _yaml_text(value) or _exists(path):
        return value
    if not path.is_absolute() and names_file(str(DATA_ROOT / path)):
        return str(DATA_ROOT / path)
    named = presets(kind)
    name = path.stem if path.suffix in (".yaml", ".yml") else path.name
    if len(path.parts) == 1 and name in named:
        return str(named[name])
    what = "no such file or preset" if len(path.parts) == 1 else "no such file"
    raise ConfigError(f"--config {value}: {what}; give a YAML file or one of the {kind} presets: "
                      f"{', '.join(named)}")


def resolve_configs(argv: Sequence[str], kind: str = "prune") -> list[str]:
    """``argv`` with each ``--config`` value (``--config V``, ``-c V``, ``--config=V``) the file it names
    (:func:`resolve_config`)."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i > 0 and argv[i - 1] in ("--config", "-c"):
            out.append(resolve_config(arg, kind))
        elif arg.startswith("--config="):
            out.append("--config=" + resolve_config(arg.split("=", 1)[1], kind))
        else:
            out.append(arg)
    return out


def config_label(value: str) -> str:
    """How a resolved ``--config`` value is shown: a shipped preset as ``configs/<kind>/<name>.yaml``."""
    path = Path(value)
    try:
        return str(path.resolve().relative_to(DATA_ROOT)) if names_file(value) else value
    except ValueError:
        return value


def check_config_files(argv: Sequence[str], kind: str = "prune") -> None:
    """Refuse a ``--config`` that names no file nor preset (:func:`resolve_config`; LightningCLI would read the
    path as YAML text and report a missing section instead), and one that is not a readable YAML mapping
    (:func:`read_config`)."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg in ("--config", "-c") and i + 1 < len(argv) else (
            arg.split("=", 1)[1] if arg.startswith("--config=") else None)
        if value is None:
            continue
        value = resolve_config(value, kind)
        if names_file(value):
            config_layers(value)
        elif not _yaml_text(value) and _exists(Path(value)):
            raise ConfigError(f"--config {value} is a directory, not a file; give a YAML file")


#: Config files read in this process, by (path, modification time, size): each file of a command line is read and
#: checked once, however many layers look at it (the checks before torch is imported, the parser's bases).
_READ: dict[tuple[str, int, int], tuple[str, dict[str, Any]]] = {}


_READ_LIMIT = 64


def read_config(path: str | Path) -> tuple[str, dict[str, Any]]:
    """A ``--config`` file's text and its YAML mapping (read once while the file is unchanged: a copy of the
    mapping each call); one ``ConfigError`` naming the file (and the line) when it cannot be read, is not UTF-8,
    is not valid YAML, is empty or is not a mapping of settings."""
    import copy

    path = Path(path)
    try:
        stat = path.stat()
    except OSError as err:
        raise ConfigError(f"cannot read --config {path} ({err.strerror or err})") from err
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _READ:
        if len(_READ) >= _READ_LIMIT:
            _READ.clear()
        _READ[key] = _read_config_file(path)
    text, data = _READ[key]
    return text, copy.deepcopy(data)


def _read_config_file(path: Path) -> tuple[str, dict[str, Any]]:
    """:func:`read_config` without the memory: read and check the file."""
    import yaml

    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"cannot read --config {path} ({err.strerror or err})") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ConfigError(f"--config {path} is not UTF-8 text (byte 0x{raw[err.start]:02x} on line {line}); save it "
                          "as UTF-8") from None
    try:
        data = yaml.load(text, Loader=_strict_loader())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" on line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"--config {path} is not valid YAML{where}: {problem}") from None
    if _expanded_size(data) > MAX_CONFIG_NODES:
        raise ConfigError(f"--config {path} expands to more than {MAX_CONFIG_NODES:,} values through its YAML aliases "
                          "(&anchor / *alias); write the settings out")
    if data is None:
        raise ConfigError(f"--config {path} is empty; give a YAML mapping of settings (e.g. search: "
                          "{max_evaluations: 0})")
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path} holds a {type(data).__name__}, not a mapping of settings; write it as "
                          "group: {key: value} lines (e.g. search: {max_evaluations: 0})")
    for key, value in data.items():
        if key in GROUP_SECTIONS and value is not None and not isinstance(value, dict) and not (
                key in CLASS_SECTIONS and isinstance(value, str)):
            raise ConfigError(f"--config {path}: {key} is a {type(value).__name__}, not a mapping of its settings; write "
                              f"it as {key}: {{key: value, ...}} (e.g. {GROUP_SECTIONS[key]})")
    return text, data


#: Top-level sections of a config that hold settings (a mapping), with an example of each.
GROUP_SECTIONS = {"model": "model: {model_name: vit_small_patch16_224.dino}",
                  "data": "data: {init_args: {root: /data/imagenet}}", "seg_data": "seg_data: {init_args: {root: x}}",
                  "importance": "importance: {min_mlp_keep: 0.05}", "search": "search: {max_evaluations: 0}",
                  "export": "export: {budgets: [{flops: 0.5}]}", "correction": "correction: {enabled: true}",
                  "evaluation": "evaluation: {metrics: [knn]}", "report": "report: {plots: false}",
                  "trainer": "trainer: {max_epochs: 2}", "optimizer": "optimizer: {class_path: torch.optim.AdamW}",
                  "lr_scheduler": "lr_scheduler: {class_path: torch.optim.lr_scheduler.StepLR}"}


#: Of those, the sections that may name a class alone (``data: snapvit_pl.data.ClassificationDataModule``).
CLASS_SECTIONS = ("model", "data", "seg_data", "optimizer", "lr_scheduler")


#: The most values a config may expand to through YAML aliases (a "billion laughs" file expands to 10^9).
MAX_CONFIG_NODES = 100_000


def _strict_loader():
    """PyYAML's safe loader, refusing a key given twice in one mapping (YAML would keep the last silently)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: YAML's merge, resolved by the base
                    continue
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice in one mapping (YAML would keep the last)",
                        key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep)

    return StrictLoader


def _expanded_size(data: Any, limit: int = MAX_CONFIG_NODES) -> int:
    """How many values ``data`` holds with every shared (aliased) part counted each time it is used; stops counting
    past ``limit``."""
    count, stack = 0, [data]
    while stack and count <= limit:
        value = stack.pop()
        count += 1
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return count


#: The top-level key of a config that extends others: ``base: base/imagenet.yaml`` (a path relative to the file's
#: folder, or a list of them) reads those files first and this file's settings over them.
BASE_KEY = "base"


def config_bases(path: Path, data: dict[str, Any]) -> list[Path]:
    """The files a config read from ``path`` (its YAML mapping ``data``) extends, in order (:data:`BASE_KEY`).

    Raises:
        ConfigError: ``base`` is not a file name or a list of them, or names no file.
    """
    value = data.get(BASE_KEY, [])
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) and item for item in items):
        raise ConfigError(f"--config {path}: {BASE_KEY} must be a file or a list of files, relative to the config's "
                          f"folder (e.g. {BASE_KEY}: base/imagenet.yaml), got {value!r}")
    bases = []
    for item in items:
        base = Path(item) if Path(item).is_absolute() else path.parent / item
        if not base.is_file():
            raise ConfigError(f"--config {path}: its {BASE_KEY} {item} is not a file (looked for {base}); give a path "
                              "relative to the config's folder")
        bases.append(base)
    return bases


def config_layers(path: str | Path, _chain: tuple[Path, ...] = ()) -> list[tuple[Path, dict[str, Any]]]:
    """The files a ``--config`` file reads, in the order they apply (its :data:`BASE_KEY` configs' layers, then the
    file), each with its settings (without ``base``).

    Raises:
        ConfigError: a file cannot be read (:func:`read_config`), a ``base`` names no file, or the bases loop.
    """
    path = Path(path)
    _, data = read_config(path)
    here = path.resolve()
    if here in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, here))
        raise ConfigError(f"--config {_chain[0]}: its {BASE_KEY} configs come back to {path} ({cycle}); remove one")
    layers = [layer for base in config_bases(path, data) for layer in config_layers(base, (*_chain, here))]
    return [*layers, (path, {key: value for key, value in data.items() if key != BASE_KEY})]


def merged_config(path: str | Path) -> dict[str, Any]:
    """A ``--config`` file's settings with its bases' under them (:func:`config_layers`): mappings merge key by key,
    any other value (a list, a number) of a later layer replaces the earlier one."""
    def merge(low: dict[str, Any], high: dict[str, Any]) -> dict[str, Any]:
        out = dict(low)
        for key, value in high.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    merged: dict[str, Any] = {}
    for _, data in config_layers(path):
        merged = merge(merged, data)
    return merged


def layered(action_class: type) -> type:
    """jsonargparse's ``--config`` action ``action_class`` reading a file's :data:`BASE_KEY` configs first
    (:func:`config_layers`), then the file's other settings over them."""
    import yaml

    class LayeredConfigFile(action_class):
        def __call__(self, parser, cfg, values, option_string=None):
            path = Path(str(values))
            if not names_file(str(values)) or BASE_KEY not in read_config(path)[1]:
                return super().__call__(parser, cfg, values, option_string)
            for _, data in config_layers(path):
                if data:
                    super().__call__(parser, cfg, yaml.safe_dump(data, sort_keys=False), option_string)

    return LayeredConfigFile


def layered_parser(parser_class: type, help: str = "Path to a configuration file in json or yaml format.",
                   **kwargs: Any) -> Any:
    """A LightningCLI parser (``LightningCLI.init_parser``'s, made here: ``parser_class(**kwargs)`` with Lightning's
    dump header) whose ``--config`` reads each file's :data:`BASE_KEY` configs first (:func:`layered`)."""
    import pytorch_lightning as pl
    from jsonargparse import ActionConfigFile

    kwargs.setdefault("dump_header", [f"pytorch_lightning=={pl.__version__}"])
    parser = parser_class(**kwargs)
    parser.add_argument("-c", "--config", action=layered(ActionConfigFile), help=help)
    return parser


def config_action(sections: Iterable[str]):
    """A ``--config`` action that reads a snapvit-pl YAML of any command, leaving out the project's sections this
    parser does not have (``sections``: its own), and reading a file's :data:`BASE_KEY` configs first."""
    import yaml
    from jsonargparse import ActionConfigFile

    own = set(sections)
    foreign = tuple(s for s in PROJECT_SECTIONS if s not in own)

    @layered
    class ConfigFile(ActionConfigFile):
        def __call__(self, parser, cfg, values, option_string=None):
            text = None
            values = resolve_config(str(values))
            path = Path(values)
            if names_file(values):
                text, data = read_config(path)
            else:
                try:
                    data = yaml.safe_load(str(values))
                except yaml.YAMLError:
                    data = None
            if isinstance(data, dict) and any(key in foreign for key in data):  # another command's config
                values = yaml.safe_dump({k: _own_keys(parser, k, v) for k, v in data.items() if k not in foreign},
                                        sort_keys=False)
            elif text is None and not isinstance(data, dict):
                raise ConfigError(f"--config {values}: no such file, and not a YAML mapping")
            self.apply_config(parser, cfg, self.dest, values)

    return ConfigFile


def _own_keys(parser, section: str, value: Any) -> Any:
    """A section of another command's config without the keys this parser does not have (prune.py's
    ``export.split`` in ``extract``); a subclass section (``class_path``, ``init_args``) stays whole."""
    if not isinstance(value, dict) or "class_path" in value:
        return value
    options = parser._option_string_actions
    return {k: v for k, v in value.items() if f"--{section}.{k}" in options}


def configs_first(argv: Sequence[str]) -> list[str]:
    """``argv`` with its ``--config`` values moved before the other options (in their order; a leading subcommand
    stays first): an option on the command line overrides every config, wherever it stands."""
    head = next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
    configs: list[str] = []
    rest: list[str] = []
    i = head
    while i < len(argv):
        if argv[i] in ("--config", "-c") and i + 1 < len(argv):
            configs += argv[i:i + 2]
            i += 2
            continue
        (configs if argv[i].startswith("--config=") else rest).append(argv[i])
        i += 1
    return [*argv[:head], *configs, *rest]
