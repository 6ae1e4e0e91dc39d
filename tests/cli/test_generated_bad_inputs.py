"""Bad input generated over the whole command-line surface (prune, extract, evaluate, deploy, hub, train) and the
public Python API: for every option a value of the wrong type, out of its domain (negative, NaN) or unparsable, and
for every file option the bad files a user has (missing, a directory, truncated, a flipped bit, the wrong kind of
file, a dangling link, a link loop, not UTF-8, empty). Each must end with exit status 2 and one ``error:`` line
naming the option or the file (no traceback), and leave nothing behind that a later run would trust; each API call
raises one of the project's errors.

The options come from the commands' own parsers and the settings dataclasses, so a new option is covered without
editing this file. In-process (``snapvit_pl.cli.main``), so the whole matrix runs in about a minute.
"""
from __future__ import annotations

import inspect
import os
import shutil
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, Optional, Union

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from families import FAMILIES, random_elastic_scores, random_subnet
from snapvit_pl.cli import main
from snapvit_pl.data import find_fashion_mnist
from snapvit_pl.errors import SnapViTError
from snapvit_pl.ranges import bounds, range_types
from snapvit_pl.models import BackboneSpec, fingerprint, load_backbone, prune_, save_pruned

ROOT = Path(__file__).resolve().parents[2]
FINETUNE = str(ROOT / "configs" / "train" / "finetune_pruned.yaml")
pytestmark = pytest.mark.skipif(find_fashion_mnist(None) is None, reason="apt-get install dataset-fashion-mnist")

#: Options that accept every value of their type (or whose domain is checked by Lightning / timm, not here).
ANY_VALUE = {"model.model_kwargs", "data.init_args.train_augment_args",
             "data.init_args.val_labels", "model.model_name", "export.latency_device"}
#: Options where a negative number or NaN is meaningful: none so far.
SIGNED: set[str] = set()
#: Choices given as plain strings (a Literal type says it itself).
CHOICES = {"progress", "data.init_args.source", "data.init_args.train_views"}


# -- the options of every command ---------------------------------------------------------------------------------
def _hints(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """``(--prefix.name, type)`` of a dataclass's fields or a constructor's parameters."""
    if hasattr(cls, "__dataclass_fields__"):
        hints = typing.get_type_hints(cls, include_extras=True)  # with the declared ranges (snapvit_pl.ranges)
        return [(f"{prefix}.{f.name}", hints[f.name]) for f in fields(cls) if f.name not in skip]
    found = []
    for klass in cls.__mro__:
        if klass.__module__.startswith("snapvit_pl") and "__init__" in vars(klass):
            hints = typing.get_type_hints(klass.__init__, include_extras=True)
            found += [(f"{prefix}.{name}", hints[name]) for name in inspect.signature(klass.__init__).parameters
                      if name in hints and name not in skip and name != "return"]
    return list(dict(found).items())


def _parser_options(parser: Any) -> list[tuple[str, Any]]:
    """A command's options and their annotations (a settings group's with its declared ranges: the parser reads the
    annotations without them)."""
    from snapvit_pl.cli.prune import settings_groups
    from snapvit_pl.ranges import declared_hints

    declared = {key: hint for group, cls in settings_groups().items() for key, hint in declared_hints(cls, group).items()}
    return [(a.dest, declared.get(a.dest, a._typehint)) for a in parser._actions
            if hasattr(a, "_typehint") and not a.dest.endswith(".help") and a.dest not in ("verbose", "data", "seg_data")]


def _prune_options() -> list[tuple[str, Any]]:
    from snapvit_pl.cli.prune import settings_groups
    from snapvit_pl.data import ClassificationDataModule
    from snapvit_pl.lightning.pruning_module import PruningModule

    options = [("out_dir", Optional[str]), ("progress", str), ("resume", Optional[str]), ("overwrite", bool)]
    for group, cls in settings_groups().items():
        options += _hints(cls, group, skip=("scorer",))
    options += _hints(PruningModule, "model")
    options += _hints(ClassificationDataModule, "data.init_args", skip=("kwargs", "model_name", "data_config"))
    return options


def _unwrap(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return _unwrap(args[0]) if typing.get_origin(hint) is Union and len(args) == 1 else hint


def bad_values(option: str, hint: Any) -> list[tuple[str, str]]:
    """``(value, kind)`` that ``option`` of type ``hint`` must refuse."""
    hint = _unwrap(hint)
    origin = typing.get_origin(hint)
    if option in ANY_VALUE:
        return []
    limits = bounds(hint)  # a constrained number type (snapvit_pl.ranges): a value just past each bound
    if limits:
        integer = range_types(hint)[0].base is int
        step = 1 if integer else 0.5
        past = {">": lambda b: b, ">=": lambda b: b - step, "<": lambda b: b, "<=": lambda b: b + step}
        values = [("abc", "type")] + ([("1.5", "type")] if integer else [("nan", "domain")])
        return values + [(str(past[op](bound)), "domain") for op, bound in limits]
    if option.split(".")[-1] == "seed":  # a seed without a declared range: every integer
        return []
    if hint is bool:
        return [("maybe", "type")]
    if hint is int:
        return [("abc", "type"), ("1.5", "type")] + ([] if option in SIGNED else [("-1", "domain")])
    if hint is float:
        return [("abc", "type")] + ([] if option in SIGNED else [("-1", "domain"), ("nan", "domain")])
    if origin is Literal or option in CHOICES:
        return [("no_such_choice", "choice")]
    if origin in (list, tuple):
        return [("[1, 2", "yaml"), ("{a: 1}", "type")]
    if origin is dict:
        return [("[1, 2]", "type")]
    return []


# -- the files a user gets wrong ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A finished tiny run (scores, models), a fine-tune checkpoint, and one of each bad file."""
    tmp = tmp_path_factory.mktemp("world")
    spec = BackboneSpec("vit_tiny_patch16_224", False, str(tmp / "base.safetensors"), {
        "img_size": 28, "patch_size": 4, "in_chans": 1, "embed_dim": 32, "depth": 2, "num_heads": 4, "num_classes": 10})
    torch.manual_seed(0)
    dense = load_backbone(BackboneSpec(spec.model_name, False, None, spec.model_kwargs))
    save_file(dense.state_dict(), spec.checkpoint_path)
    subnet = random_subnet(dense, 0)
    extra = {"base_spec": spec.to_dict(), "base_fingerprint": fingerprint(dense)}
    save_pruned(prune_(load_backbone(spec), subnet), tmp / "pruned", spec, subnet, extra=extra)
    scores = random_elastic_scores(dense)
    scores.base = spec.to_dict()
    scores.save(tmp / "scores.safetensors")
    weights = (tmp / "base.safetensors").read_bytes()
    (tmp / "truncated.safetensors").write_bytes(weights[: len(weights) // 3])
    (tmp / "noise.safetensors").write_bytes(np.random.default_rng(0).integers(0, 256, 4096, np.uint8).tobytes())
    scores_bytes = bytearray((tmp / "scores.safetensors").read_bytes())
    scores_bytes[-8] ^= 0x10  # one bit of the last tensor
    (tmp / "flipped_scores.safetensors").write_bytes(bytes(scores_bytes))
    (tmp / "truncated_scores.safetensors").write_bytes(bytes(scores_bytes[: len(scores_bytes) // 2]))
    for name, damage in (("flipped_weights", "model.safetensors"), ("flipped_record", "architecture.json")):
        (tmp / name).mkdir()
        for f in ("model.safetensors", "architecture.json"):
            data = bytearray((tmp / "pruned" / f).read_bytes())
            if f == damage:
                data[len(data) * 3 // 4] ^= 0x04
            (tmp / name / f).write_bytes(bytes(data))
    (tmp / "truncated_model").mkdir()
    (tmp / "truncated_model" / "architecture.json").write_bytes((tmp / "pruned" / "architecture.json").read_bytes())
    (tmp / "truncated_model" / "model.safetensors").write_bytes((tmp / "pruned" / "model.safetensors").read_bytes()[:999])
    (tmp / "empty_dir").mkdir()
    (tmp / "a_file").write_text("x")
    (tmp / "dangling").symlink_to(tmp / "deleted")
    (tmp / "loop").symlink_to(tmp / "loop")
    (tmp / "latin1.yaml").write_bytes("search:\n  max_evaluations: 0  # d\xe9j\xe0\n".encode("latin-1"))
    (tmp / "broken.yaml").write_text("search:\n  max_evaluations: [1\n")
    (tmp / "empty.yaml").write_text("")
    (tmp / "list.yaml").write_text("- a\n- b\n")
    (tmp / "finished").mkdir()
    (tmp / "finished" / "config.yaml").write_text("{}\n")
    (tmp / "finished" / "report.json").write_text("{}")
    (tmp / "images" / "a").mkdir(parents=True)
    for i in range(3):
        Image.fromarray(np.full((28, 28), 40 * i, np.uint8)).save(tmp / "images" / "a" / f"{i}.png")
    _interrupted_run(tmp)
    ckpt = {"state_dict": {"model.x": torch.zeros(3)}, "epoch": 0, "global_step": 1}
    torch.save(ckpt, tmp / "good.ckpt")
    (tmp / "truncated.ckpt").write_bytes((tmp / "good.ckpt").read_bytes()[:200])
    _issue48_files(tmp)
    return tmp


def _issue48_files(tmp: Path) -> None:
    """What a user has that the tool must not read for ever, replace, or misread: named pipes where files belong, a
    folder of their own files, a config whose section is a list, a record edited with its checksum recomputed, a
    fine-tune's checkpoint given to another kind of training, data of one class."""
    import json

    from snapvit_pl.io import verify_checksum, with_checksum

    for name in ("fifo", "fifo.yaml"):
        os.mkfifo(tmp / name)
    (tmp / "user_files").mkdir()
    (tmp / "user_files" / "config.yaml").write_text("my: own settings\n")
    (tmp / "user_files" / "notes.txt").write_text("x")
    (tmp / "section_list.yaml").write_text("export: [1, 2]\n")
    record = tmp / "string_params" / "architecture.json"
    shutil.copytree(tmp / "pruned", tmp / "string_params")
    data = verify_checksum(json.loads(record.read_text()), record, "")
    data["extra"] = {**data["extra"], "params": "14k"}
    record.write_text(json.dumps(with_checksum(data)))
    torch.save({"state_dict": {}, "epoch": 0, "global_step": 1,
                "hyper_parameters": {"checkpoint": "x", "loss": "both"}}, tmp / "finetune.ckpt")
    for split, count in (("train", 6), ("val", 3)):
        (tmp / "one_class" / split / "a").mkdir(parents=True)
        for i in range(count):
            Image.fromarray(np.full((28, 28), 20 * i, np.uint8)).save(tmp / "one_class" / split / "a" / f"{i}.png")
    shutil.copytree(tmp / "one_class", tmp / "fifo_images")
    shutil.copytree(tmp / "fifo_images" / "train" / "a", tmp / "fifo_images" / "train" / "b")
    shutil.copytree(tmp / "fifo_images" / "val" / "a", tmp / "fifo_images" / "val" / "b")
    os.mkfifo(tmp / "fifo_images" / "train" / "b" / "0b.png")


def _interrupted_run(world: Path) -> None:
    """``world/interrupted``: a tiny prune run with a latency budget that the disk filled up during the export
    (its config, progress and latency table saved; what ``--resume`` reads)."""
    from faults import disk_full_at

    args = [a.replace("--export.budgets=[]", "") for a in _base_args("prune", world, world)]
    args = _with(_with(_with(args, "--out_dir", str(world / "interrupted")), "--export.budgets",
                       "[{latency: 1000}, {flops: 0.6}]"), "--export.latency_batch_size", "2")
    with pytest.MonkeyPatch.context() as patch:
        disk_full_at(patch, "snapvit_pl.models.checkpoint.save_file", 1)
        assert main(args) == 2
    assert {"config.yaml", "resume_state.pt", "latency_table.json"} <= {p.name for p in (world / "interrupted").iterdir()}


#: A damaged artifact of a real run and the command that reads it: (file, how it is damaged, command, error names).
ARTIFACT_CASES = [
    ("resume_state.pt", "flip", ["prune", "--resume", "RUN"], "start the run again"),
    ("resume_state.pt", "truncate", ["prune", "--resume", "RUN"], "start the run again"),
    ("config.yaml", "edit", ["prune", "--resume", "RUN"], "changed since the run started"),
    ("latency_table.json", "edit", ["prune", "--resume", "RUN"], "latency_table.json"),
    ("latency_table.json", "edit", ["extract", "--scores", "WORLD/scores.safetensors", "--out_dir", "OUT/cut",
                                    "--export.budgets=[{latency: 1000}]", "--export.latency_batch_size=2",
                                    "--export.latency_table=RUN/latency_table.json"], "checksum"),
]


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x08
    elif how == "truncate":
        data = data[: len(data) // 2]
    else:  # an edit that keeps the file valid: a digit changed (in JSON, one that changes a value: the 17th digit
        # of a float may name the same number)
        import json

        for i in sorted((i for i, c in enumerate(data) if chr(c).isdigit() and 0 < i < len(data) - 200), reverse=True):
            edited = bytearray(data)
            edited[i] = ord("7") if data[i] != ord("7") else ord("3")
            if path.suffix != ".json" or json.loads(bytes(edited)) != json.loads(bytes(data)):
                data = edited
                break
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name, how, command, named", ARTIFACT_CASES,
                         ids=[f"{n} {h} -> {c[0]}" for n, h, c, _ in ARTIFACT_CASES])
def test_a_damaged_artifact_is_refused_by_its_reader(world, tmp_path, capsys, name, how, command, named):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(world / "interrupted", run)
    _damage(run / name, how)
    argv = [a.replace("RUN", str(run)).replace("WORLD", str(world)).replace("OUT", str(tmp_path)) for a in command]
    before = _snapshot(world, run)
    _clean(capsys, main(argv), named)
    assert _snapshot(world, run) == before


#: Bad files per file option: (command, option, the file under the world folder, what the error line names).
FILE_CASES = [
    *[("prune", "--model.checkpoint_path", f, w) for f, w in (
        ("missing.safetensors", "not found"), ("empty_dir", "is a directory"), ("truncated.safetensors", "could not load"),
        ("noise.safetensors", "could not load"), ("scores.safetensors", "could not load"), ("dangling", "not found"),
        ("loop", "checkpoint"))],
    *[("prune", "--config", f, w) for f, w in (
        ("missing.yaml", "no such file"), ("empty_dir", "is a directory"), ("latin1.yaml", "not UTF-8"),
        ("broken.yaml", "line 3"), ("empty.yaml", "is empty"), ("list.yaml", "not a mapping"), ("dangling", "no such file"),
        ("a_file", "not a mapping"))],
    *[("prune", "--data.init_args.root", f, w) for f, w in (
        ("missing", "does not exist"), ("a_file", "is a file, not a folder"), ("empty_dir", "not an image folder"),
        ("dangling", "does not exist"), ("images", "val_split"))],
    *[("prune", "--resume", f, w) for f, w in (("missing", "config.yaml"), ("a_file", "config.yaml"),
                                              ("empty_dir", "config.yaml"), ("finished", "already finished"))],
    *[("prune", "--out_dir", f, w) for f, w in (("a_file", "is a file"), ("a_file/run", "under the file"))],
    *[("prune", "--export.scores_file", f, w) for f, w in (("../../victim", "inside the run directory"),
                                                          ("ABSOLUTE", "inside the run directory"),
                                                          ("report.json", "inside the run directory"))],
    ("prune", "--export.latency_table", "empty_dir", "is a directory"),
    *[("extract", "--scores", f, w) for f, w in (
        ("missing.safetensors", "not found"), ("empty_dir", "a directory"), ("truncated_scores.safetensors", "scores"),
        ("flipped_scores.safetensors", "checksum"), ("noise.safetensors", "not a readable"),
        ("base.safetensors", "not a snapvit-pl elastic-scores file"), ("dangling", "not found"), ("loop", "scores"))],
    ("extract", "--out_dir", "a_file", "is a file"),
    *[(command, "--checkpoint", f, w) for command in ("evaluate", "deploy", "hub card") for f, w in (
        ("missing", "not found"), ("base.safetensors", "is a file"), ("empty_dir", "not found"),
        ("flipped_weights", "checksum"), ("flipped_record", "architecture.json"), ("truncated_model", "checksum"),
        ("dangling", "not found"))],
    ("evaluate", "--out", "empty_dir", "is a directory"),
    ("evaluate", "--out", "a_file/out.json", "under the file"),
    ("deploy", "--out", "empty_dir", "is a directory"),
    *[("train fit", "--model.checkpoint", f, w) for f, w in (
        ("missing", "not found"), ("base.safetensors", "is a file"), ("flipped_weights", "checksum"))],
    *[("train fit", "--ckpt_path", f, w) for f, w in (("truncated.ckpt", "truncated.ckpt"),
                                                     ("missing.ckpt", "missing.ckpt"), ("fifo", "named pipe"))],
    # issue 48: a named pipe is refused, never read (a read would wait for ever)
    ("prune", "--config", "fifo.yaml", "named pipe"), ("prune", "--model.checkpoint_path", "fifo", "named pipe"),
    ("extract", "--scores", "fifo", "named pipe"), ("evaluate", "--out", "fifo", "named pipe"),
    ("prune", "--data.init_args.root", "fifo_images", "0b.png is a named pipe"),
    # an output folder that is not the tool's own, or holds an interrupted run, is not replaced without asking
    ("prune", "--out_dir", "user_files", "is not empty"), ("prune", "--out_dir", "interrupted", "--resume"),
    # a file of the user's is not replaced by a report or an ONNX file without --overwrite true
    ("evaluate", "--out", "a_file", "not written by this command"), ("deploy", "--out", "a_file", "not written by this"),
    # a config whose section is a list; a record whose fields have the wrong kind (checksum recomputed)
    ("prune", "--config", "section_list.yaml", "export is a list"),
    ("extract", "--config", "section_list.yaml", "export is a list"),
    *[(command, "--checkpoint", "string_params", "extra.params") for command in ("hub card", "evaluate", "deploy")],
    # a fine-tune's checkpoint given to self-distillation; one class for k-NN
    ("pretrain fit", "--ckpt_path", "finetune.ckpt", "another kind of training"),
    ("evaluate", "--data.init_args.root", "one_class", "at least 2 classes"),
]


def _base_args(command: str, world: Path, out: Path) -> list[str]:
    """A valid invocation of ``command`` (the option under test is added or replaces its value)."""
    tiny = ["--model.checkpoint_path", str(world / "base.safetensors"), "--model.model_kwargs.embed_dim=32",
            "--model.model_kwargs.depth=2", "--model.model_kwargs.num_heads=4", "--data.init_args.max_samples=48",
            "--data.init_args.batch_size=16", "--search.num_images=32", "--search.pca_components=8",
            "--evaluation.metrics=[]", "--report.plots=false", "--progress=off", "--out_dir", str(out / "run")]
    return {
        "prune": ["prune", *tiny],
        "extract": ["extract", "--scores", str(world / "scores.safetensors"), "--out_dir", str(out / "cut"),
                    "--export.budgets=[{flops: 0.6}]", "--progress=off"],
        "evaluate": ["evaluate", "--checkpoint", str(world / "pruned"), "--evaluation.metrics=[knn]",
                     "--evaluation.train_samples=50", "--evaluation.val_samples=20", "--out", str(out / "eval.json")],
        "deploy": ["deploy", "--checkpoint", str(world / "pruned"), "--out", str(out / "m.onnx")],
        "hub card": ["hub", "card", "--checkpoint", str(world / "pruned"), "--repo", "org/name"],
        "train fit": ["train", "fit", "--config", FINETUNE, "--model.checkpoint", str(world / "pruned"),
                      f"--trainer.default_root_dir={out / 'ft'}", "--trainer.max_epochs=1",
                      "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1",
                      "--data.init_args.batch_size=8", "--trainer.enable_progress_bar=false"],
        "train test": ["train", "test", "--config", FINETUNE, "--model.checkpoint", str(world / "pruned"),
                       f"--trainer.default_root_dir={out / 'ft'}", "--trainer.limit_test_batches=1",
                       "--data.init_args.batch_size=8", "--trainer.enable_progress_bar=false"],
        "pretrain fit": ["pretrain", "fit", "--config", str(ROOT / "configs" / "train" / "dino_fmnist.yaml"),
                         f"--trainer.default_root_dir={out / 'pt'}", "--trainer.max_epochs=1",
                         "--trainer.limit_train_batches=1", "--trainer.enable_progress_bar=false"],
    }[command]


def _with(args: list[str], option: str, value: str) -> list[str]:
    """``args`` with ``option`` set to ``value`` (replacing a value given there)."""
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == option:
            skip = True
            continue
        if arg.startswith(option + "="):
            continue
        out.append(arg)
    if option == "--config" and args[0] in ("train", "pretrain"):
        return out[:2] + [f"{option}={value}"] + out[2:]
    return out + [f"{option}={value}"]


def _option_cases() -> list[tuple[str, str, str, str, str]]:
    """``(command, option, value, kind, leaf)``: every option of every command with each of its bad values."""
    from snapvit_pl.cli import deploy, evaluate, extract

    commands = {"prune": _prune_options(), "extract": _parser_options(extract.build_parser()),
                "evaluate": _parser_options(evaluate.build_parser()), "deploy": _parser_options(deploy.build_parser())}
    cases = []
    for command, options in commands.items():
        for option, hint in options:
            for value, kind in bad_values(option, hint):
                cases.append((command, f"--{option}", value, kind, option.split(".")[-1]))
        cases.append((command, "--no_such_option", "1", "unknown", "no_such_option"))
    for group in ("importance", "search", "export", "correction", "evaluation", "report", "model", "data.init_args"):
        cases.append(("prune", f"--{group}.no_such_key", "1", "unknown", "no_such_key"))
    return cases


OPTION_CASES = _option_cases()
#: Whole invocations: (command line with WORLD/OUT placeholders, what the error line says).
OTHER_CASES = [
    (["prune", "--export.budgets=[{mlp_ratio: 0.601, head_ratio: 0.2}, {mlp_ratio: 0.604, head_ratio: 0.2}]"],
     "would both be saved as mlp0.60_head0.20"),
    (["prune", "--export.budgets=[{sparsity: 0.3}, {sparsity: 0.30000000001}]"], "would both be saved as"),
    (["prune", "--export.budgets=[{params: 5e6}]"], "too high"),
    (["prune", "--export.budgets=[{flops: 1.5}]"], "read as a count"),
    (["prune", "--export.budgets=[{sparsity: 0.99}]"], "sparsity budget {sparsity: 0.99}"),
    (["prune", "--export.budgets=[{sparsity: 0}]"], "budget {sparsity: 0} removes nothing"),
    (["prune", "--correction.method=sparsegpt", "--correction.refit=following"],
     "correction.refit 'following' applies to correction.method dense_fit only, and the method is sparsegpt"),
    (["prune", "--export.budgets=[{}]"], "got {}"),
    (["prune", "--export.budgets=[{latency: 0.0001}]", "--export.latency_batch_size=2"], "too low"),
    (["prune", "--data.init_args.batch_size=64", "--data.init_args.max_samples=48"], "raise data.init_args.max_samples"),
    (["extract", "--export.budgets=[{sparsity: 0.2}, {sparsity: 0.2}]"], "is given twice"),
    (["train fit", "--trainer.max_steps=0"], "--trainer.max_steps 0 trains nothing"),
    (["train fit", "--trainer.max_epochs=0"], "--trainer.max_epochs 0 trains nothing"),
    # issue 48: what Lightning, numpy, torch or torchmetrics refused with a traceback
    (["train fit", "--trainer.devices=-2"], "--trainer.devices -2"),
    (["pretrain fit", "--trainer.devices=0"], "--trainer.devices 0"),
    (["train fit", "--seed_everything=99999999999"], "seeds lie in"),
    (["train test", "--ckpt_path=best"], "--ckpt_path best"),
    (["evaluate", "--device=gpu0"], "not a device name"),
    (["evaluate", "--device=cuda:7"], "not available"),
    # a misspelt option at any depth: the likely one
    (["prune", "--data.init_args.rot=/data"], "did you mean --data.init_args.root"),
    (["evaluate", "--data.init_args.rot=/data"], "did you mean --data.init_args.root"),
    (["train fit", "--model.checkpont=x"], "did you mean --model.checkpoint"),
    (["train fit", "--data.init_args.batch_sise=2"], "did you mean --data.init_args.batch_size"),
    (["extract", "--export.budgts=[]"], "did you mean --export.budgets"),
]


def _clean(capsys, code: int, *named: str) -> None:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, (code, err[-1500:])
    assert any(name.lower() in errors[0].lower() for name in named), errors[0]


def _snapshot(*folders: Path) -> list:
    return sorted((p.as_posix(), p.stat().st_size if p.is_file() and not p.is_symlink() else None)
                  for folder in folders if folder.exists() for p in folder.rglob("*"))


def _run(world: Path, out: Path, argv: list[str], capsys, *named: str) -> None:
    before = _snapshot(world, out)
    _clean(capsys, main(argv), *named)
    assert _snapshot(world, out) == before, "a refused invocation leaves nothing behind"


@pytest.mark.parametrize("command, option, value, kind, leaf", OPTION_CASES,
                         ids=[f"{c} {o}={v}" for c, o, v, _, _ in OPTION_CASES])
def test_a_bad_value_of_any_option(world, tmp_path, capsys, command, option, value, kind, leaf):
    argv = _with(_base_args(command, world, tmp_path), option, value)
    _run(world, tmp_path, argv, capsys, leaf, value)


@pytest.mark.parametrize("command, option, name, named", FILE_CASES, ids=[f"{c} {o} {n}" for c, o, n, _ in FILE_CASES])
def test_a_bad_file_for_any_file_option(world, tmp_path, capsys, command, option, name, named):
    value = str(world / name) if option != "--export.scores_file" or name == "ABSOLUTE" else name
    argv = _base_args(command, world, tmp_path)
    if option == "--resume":
        argv = ["prune", "--resume", value]
    elif option == "--data.init_args.root":
        argv = _with(_with(argv, "--data.init_args.source", "folder"), option, value)
    else:
        argv = _with(argv, option, value)
    _run(world, tmp_path, argv, capsys, named)


@pytest.mark.parametrize("extra, named", OTHER_CASES, ids=[n for _, n in OTHER_CASES])
def test_a_bad_invocation(world, tmp_path, capsys, extra, named):
    command = extra[0]
    argv = _base_args(command, world, tmp_path)
    for item in extra[1:]:
        option, value = item.split("=", 1)
        argv = _with(argv, option, value)
    _run(world, tmp_path, argv, capsys, named)


#: Commands whose every invocation starts the same way (run_command): the environment is checked for all of them.
ALL_COMMANDS = ["prune", "extract", "evaluate", "deploy", "hub card", "train fit", "pretrain fit"]
#: A process environment the command cannot run in: (variable, value, what the error line names).
ENVIRONMENTS = [("SNAPVIT_VERBOSE", "maybe", "SNAPVIT_VERBOSE"), ("SNAPVIT_PROGRESS_INTERVAL", "abc",
                                                                  "SNAPVIT_PROGRESS_INTERVAL"),
                ("working directory", "deleted", "working directory no longer exists")]


@pytest.mark.parametrize("variable, value, named", ENVIRONMENTS, ids=[v for v, _, _ in ENVIRONMENTS])
@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_a_bad_environment_for_any_command(world, tmp_path, capsys, monkeypatch, command, variable, value, named):
    """Issue 48: a deleted working directory (torch itself would not load: oneMKL's FATAL ERROR, no error line), an
    environment variable the tool reads set to what it does not take: one line, before anything is read."""
    if variable == "working directory":
        gone = tmp_path / "gone"
        gone.mkdir()
        monkeypatch.chdir(gone)
        gone.rmdir()
    else:
        monkeypatch.setenv(variable, value)
    _run(world, tmp_path, _base_args(command, world, tmp_path), capsys, named)


def test_snapvit_verbose_0_means_no_traceback(world, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SNAPVIT_VERBOSE", "0")  # read as "verbose" before: the traceback of a plain bad budget
    _run(world, tmp_path, _with(_base_args("prune", world, tmp_path), "--export.budgets", "[{sparsity: 2}]"), capsys,
         "sparsity")


@pytest.mark.parametrize("command", ["prune", "extract", "evaluate", "deploy", "train fit"])
def test_ctrl_c_while_the_model_loads_is_one_line_and_leaves_nothing(world, tmp_path, capsys, monkeypatch, command):
    """Issue 48: SIGINT while the model loaded was a bare KeyboardInterrupt traceback. Status 130 (interrupted), one
    line, nothing half-written."""
    import timm

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(timm, "create_model", interrupted)
    before = _snapshot(world, tmp_path)
    assert main(_base_args(command, world, tmp_path)) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted:") and "Traceback" not in lines[0], lines
    assert _snapshot(world, tmp_path) == before


# -- the Python API -----------------------------------------------------------------------------------------------
def _api_cases(world: Path) -> list[tuple[str, Any]]:
    import snapvit_pl
    from snapvit_pl.elastic import Budget, ElasticScores
    from snapvit_pl.eval.linear_probe import linear_probe
    from snapvit_pl.models import load_pruned
    from snapvit_pl.pipeline import extract_models

    model = load_backbone(FAMILIES["dino_vit"])
    scores = random_elastic_scores(model)
    images = [torch.randn(4, 3, 32, 32)]
    nan_model = load_backbone(FAMILIES["dino_vit"])
    with torch.no_grad():
        nan_model.blocks[0].mlp.fc1.weight[0, 0] = float("nan")
    return [
        ("fit_elastic(None, None)", lambda: snapvit_pl.fit_elastic(None, None)),
        ("fit_elastic(path, None)", lambda: snapvit_pl.fit_elastic("vit_small.safetensors", None)),
        ("fit_elastic(model, None)", lambda: snapvit_pl.fit_elastic(model, None)),
        ("fit_elastic(linear)", lambda: snapvit_pl.fit_elastic(torch.nn.Linear(2, 2), images)),
        ("fit_elastic(nan weights)", lambda: snapvit_pl.fit_elastic(nan_model, images)),
        ("fit_elastic(search=bad dict)", lambda: snapvit_pl.fit_elastic(model, images, search={"max_evaluationz": 1})),
        ("fit_elastic(search=list)", lambda: snapvit_pl.fit_elastic(model, images, search=[1])),
        ("fit_elastic(scorer=str)", lambda: snapvit_pl.fit_elastic(model, images, scorer="fisher")),
        ("fit_elastic(1 channel)", lambda: snapvit_pl.fit_elastic(model, [torch.randn(4, 1, 32, 32)], progress="off")),
        ("fit_elastic(28 px)", lambda: snapvit_pl.fit_elastic(model, [torch.randn(4, 3, 28, 28)], progress="off")),
        ("fit_elastic(uint8)", lambda: snapvit_pl.fit_elastic(model, [torch.zeros(4, 3, 32, 32, dtype=torch.uint8)],
                                                              progress="off")),
        ("fit_elastic(fitness 2-d)", lambda: snapvit_pl.fit_elastic(model, images, fitness_images=torch.zeros(3, 3))),
        ("fit_elastic(strings)", lambda: snapvit_pl.fit_elastic(model, ["a", "b"], progress="off")),
        ("load_pruned(map_location=gpu7)", lambda: load_pruned(world / "pruned", map_location="gpu7")),
        ("load_pruned(map_location=3.5)", lambda: load_pruned(world / "pruned", map_location=3.5)),
        ("load_pruned(map_location=cuda:9)", lambda: load_pruned(world / "pruned", map_location="cuda:9")),
        ("load_pruned(None)", lambda: load_pruned(None)),
        ("load_pruned(file)", lambda: load_pruned(world / "base.safetensors")),
        ("load_pruned(flipped)", lambda: load_pruned(world / "flipped_weights")),
        ("ElasticScores.load(dir)", lambda: ElasticScores.load(world / "empty_dir")),
        ("ElasticScores.load(flipped)", lambda: ElasticScores.load(world / "flipped_scores.safetensors")),
        ("scores.save(dir)", lambda: scores.save(world / "empty_dir")),
        ("save_pruned(onto a folder of work)", lambda: save_pruned(prune_(load_backbone(FAMILIES["dino_vit"]),
                                                                          random_subnet(model, 0)), world / "images",
                                                                   FAMILIES["dino_vit"])),
        ("scores.extract(str)", lambda: scores.extract("model", flops=0.5)),
        ("scores.extract(flop=)", lambda: scores.extract(model, flop=0.5)),
        ("scores.extract(params=5e9)", lambda: scores.extract(model, params=5e9)),
        ("Budget.parse(list)", lambda: Budget.parse([0.5])),
        ("Budget.parse(text)", lambda: Budget.parse("flops")),
        ("Budget(sparsity=nan)", lambda: Budget(sparsity=float("nan"))),
        ("extract_models(colliding labels)", lambda: extract_models(model, scores, [Budget(sparsity=0.3),
                                                                                    Budget(sparsity=0.30000000001)])),
        # issue 48
        ("fit_elastic(model.half(), float32 images)", lambda: snapvit_pl.fit_elastic(
            load_backbone(FAMILIES["dino_vit"]).half(), images, progress="off")),
        ("load_pruned(map_location=gpu0)", lambda: load_pruned(world / "pruned", map_location="gpu0")),
        ("load_pruned(edited extra)", lambda: load_pruned(world / "string_params")),
        ("ElasticScores.load(fifo)", lambda: ElasticScores.load(world / "fifo")),
        ("linear_probe(one class)", lambda: linear_probe(torch.randn(8, 4), torch.zeros(8), torch.randn(4, 4),
                                                         torch.zeros(4))),
        ("load_backbone(checkpoint_path=fifo)", lambda: load_backbone(BackboneSpec(
            FAMILIES["dino_vit"].model_name, False, str(world / "fifo"), FAMILIES["dino_vit"].model_kwargs))),
    ]


def test_the_python_api_raises_only_the_projects_errors(world):
    """Every bad call raises a SnapViTError (a subclass of ValueError/TypeError/OSError as fits): its message names
    the problem; nothing from deep inside timm or torch (AttributeError, AssertionError, ...)."""
    unclean = []
    cases = _api_cases(world)
    before = _snapshot(world)
    for name, call in cases:
        try:
            call()
            unclean.append(f"{name}: accepted")
        except SnapViTError as err:
            if "\n" in str(err).strip() or not str(err):
                unclean.append(f"{name}: {err!r}")
        except Exception as err:  # noqa: BLE001 - what this test looks for
            unclean.append(f"{name}: {type(err).__name__}: {str(err)[:200]}")
    assert not unclean, "\n".join(unclean)
    assert _snapshot(world) == before and len(cases) >= 30


def test_the_matrix_is_large():
    assert len(OPTION_CASES) + len(FILE_CASES) + len(OTHER_CASES) + len(ARTIFACT_CASES) >= 250
