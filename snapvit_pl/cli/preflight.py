"""What a command line knows before it imports torch: the settings in effect, read from its YAML files and its
``--group.key value`` options, and the checks they allow (option names, the weights file, the data root), so
that a typo or a wrong path is one ``error:`` line within a second, before any weights are loaded or downloaded.

The command's own parser (jsonargparse, after the heavy imports) still reads everything again and has the
last word; what is refused here it would refuse too.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from ..errors import ConfigError

#: Groups that name a class (``class_path``) with its arguments under ``init_args``; ``--data.root`` means
#: ``--data.init_args.root``.
SUBCLASS_GROUPS = ("data", "seg_data", "importance.scorer")
_SUBCLASS_KEYS = ("class_path", "init_args", "dict_kwargs", "help")


def _yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _value(text: str) -> Any:
    """A command-line value as the parser reads it: ``true``/``false``, ``null``, numbers, YAML lists and
    mappings; any other word stays a string (``--progress off`` is ``"off"``, not YAML's false)."""
    word = text.strip().lower()
    if word in ("true", "false"):
        return word == "true"
    if word in ("null", "none"):
        return None
    if text.lstrip()[:1] in ("[", "{"):
        return _yaml(text)
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def normalize_key(key: str) -> str:
    """``data.root`` -> ``data.init_args.root`` (a subclass group's argument), a trailing ``+`` (append) dropped."""
    key = key.rstrip("+")
    for group in SUBCLASS_GROUPS:
        if key.startswith(group + "."):
            rest = key[len(group) + 1:]
            if rest.split(".")[0] not in _SUBCLASS_KEYS:
                return f"{group}.init_args.{rest}"
    return key


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted keys (``{"search": {"num_images": 8}}`` -> ``{"search.num_images": 8}``)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = normalize_key(f"{prefix}{key}")
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _set(values: dict[str, Any], key: str, value: Any) -> None:
    for old in [k for k in values if k.startswith(key + ".")]:  # a mapping given whole replaces the old one
        del values[old]
    if isinstance(value, dict) and value:
        values.update(flatten(value, key + "."))
    else:
        values[key] = value


def split_options(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, Any]]]:
    """``argv`` -> (the ``--config`` values in order, the other ``--key value`` options as (key, YAML value))."""
    configs, options, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg in ("-h", "--help"):
            i += 1
            continue
        key, has_value, value = arg.lstrip("-").partition("=")
        if not has_value and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 1
        i += 1
        if key in ("config", "c"):
            configs.append(value)
        elif key != "print_config":
            options.append((normalize_key(key), _value(value) if (has_value or value) else True))
    return configs, options


def config_file_values(config: str) -> dict[str, Any]:
    """The flattened settings of one ``--config`` value (a YAML file, or YAML text)."""
    from ..config_files import merged_config, names_file

    data = merged_config(Path(config)) if names_file(config) else _yaml(config)  # a file with the files it extends (base:)
    return flatten(data) if isinstance(data, dict) else {}


def given_settings(argv: Sequence[str], default_config: Optional[Path] = None) -> tuple[list[str], dict[str, Any]]:
    """Every key ``argv`` gives (its options', then its ``--config`` files', flattened) and the settings in effect:
    the files in order (``default_config`` when none), then the options (the last wins); each file read once."""
    configs, options = split_options(argv)
    keys = [k for key, value in options for k in flatten({key: value})]
    values: dict[str, Any] = {}
    for config in configs or ([str(default_config)] if default_config else []):
        for key, value in config_file_values(config).items():
            keys.append(key)
            _set(values, key, value)
    for key, value in options:
        _set(values, key, value)
    return keys, values


def settings_in_effect(argv: Sequence[str], default_config: Optional[Path] = None) -> dict[str, Any]:
    """The flattened settings ``argv`` asks for (:func:`given_settings`)."""
    return given_settings(argv, default_config)[1]


def check_option_names(keys: Iterable[str], known: Sequence[str], command: str,
                       arguments: Optional[dict[str, Sequence[str]]] = None) -> None:
    """Refuse a key that is no option: neither one of ``known`` nor under one of them (``model.model_kwargs.x``:
    the option's own value is checked by the command's parser). ``arguments``: for a subclass group whose class is
    known (``data.init_args.``), its arguments' keys: a key under that prefix must be one of them (or under one)."""
    known_set = set(known)
    groups = {".".join(option.split(".")[:n]) for option in known for n in range(1, option.count(".") + 1)}
    for key in keys:
        parts = key.split(".")
        prefix = next((p for p in (arguments or {}) if key.startswith(p)), None)
        if prefix is not None:
            names = list(arguments[prefix])
            if any(".".join(parts[:n]) in names for n in range(1, len(parts) + 1)):
                continue
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.75)
            hint = f"did you mean --{close[0]}? " if close else ""
            raise ConfigError(f"--{key}: no such option; {hint}see {command} --help for the options")
        if key in groups or any(".".join(parts[:n]) in known_set for n in range(1, len(parts) + 1)):
            continue  # a group given whole (--search '{...}': its keys are checked one by one) or an option
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
        hint = f"did you mean --{close[0]}? " if close else ""
        raise ConfigError(f"--{key}: no such option; {hint}see {command} --help for the options")


def check_option_values(values: dict[str, Any], kinds: dict[str, Any], command: str) -> None:
    """Refuse a value of the wrong kind for a plain option (``kinds``: option -> ``"int"``, ``"float"``,
    ``"bool"`` (``"?"``: or null) or a list of choices), as the command's parser would. A number's range is not
    checked here: the settings object checks it, once, as it is built (:mod:`snapvit_pl.ranges`)."""
    for key, value in values.items():
        kind = kinds.get(key)
        if kind is None or (value is None and (isinstance(kind, list) or kind.endswith("?"))):
            continue
        if isinstance(value, str) and not isinstance(kind, list) and kind.rstrip("?") != "bool":
            value = _value(value)  # YAML reads 1e-3 as a string; the parser as a number
        if isinstance(kind, list):
            ok, expected = value in kind, "one of " + ", ".join(str(c) for c in kind)
        else:
            name = kind.rstrip("?")
            ok = isinstance(value, bool) if name == "bool" else (
                isinstance(value, int) if name == "int" else isinstance(value, (int, float))) and \
                (name == "bool" or not isinstance(value, bool))
            expected = {"bool": "true or false", "int": "an integer", "float": "a number"}[name]
        if not ok:
            raise ConfigError(f"--{key}: expected {expected}, got {value!r}; see {command} --help for the options")


def check_inputs(values: dict[str, Any]) -> None:
    """Refuse a missing weights file (``model.checkpoint_path``) and a missing image-folder root (``data`` with
    ``source: folder``): the paths a run reads first, checked before any weights are loaded.

    Raises:
        CheckpointError, DataError: naming the path and the fix.
    """
    from ..data.layouts import check_folder_root
    from ..io import weights_file

    if values.get("model.checkpoint_path"):
        weights_file(values["model.checkpoint_path"])
    class_path = str(values.get("data.class_path") or "ClassificationDataModule")
    source = str(values.get("data.init_args.source") or "").lower()
    if class_path.endswith("ClassificationDataModule") and source == "folder":
        check_folder_root(str(values.get("data.init_args.root") or "data"))
