"""Every kind of file snapvit-pl writes and reads back, mutated (issue 37): starting from genuine files of one small
run, Hypothesis deletes fields, swaps types, sets extreme and non-finite values, changes versions, truncates, flips
bytes and nests, either leaving the checksum as it was (an edit, a damaged copy) or re-signing the mutant (a crafted
file). For every mutant the kind's reader (the one the CLI, the Python API, the Hub and train.py share) must either
give the genuine result, or refuse it with one project error (a ``SnapViTError``: one ``error:`` line, exit 2, from
the command line; at reading or where the result is first used), or, for a re-signed mutant its schema allows, give
a result its users can use without a traceback (a model that runs, predictions that are finite, scores that cut a budget). A handful of mutants per kind
also go through the command line: one ``error:`` line, exit 2, nothing written.

Mutants per kind: ``SNAPVIT_MUTANTS`` (default 200; ``--hypothesis-show-statistics`` lists what ran)."""
import copy
import json
import math
import os
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from snapvit_pl.cli import main
from snapvit_pl.data import find_fashion_mnist
from snapvit_pl.errors import SnapViTError
from snapvit_pl.io import CHECKSUM_KEY, content_digest, with_checksum

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(find_fashion_mnist(None) is None, reason="apt-get install dataset-fashion-mnist")]
ROOT = Path(__file__).resolve().parents[1]
MUTANTS = int(os.environ.get("SNAPVIT_MUTANTS", "200"))
MUTATION = settings(max_examples=MUTANTS, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck))

TINY = ["--model.checkpoint_path=null", "--model.pretrained=false", "--model.model_kwargs.embed_dim=32",
        "--model.model_kwargs.depth=2", "--model.model_kwargs.num_heads=4", "--data.init_args.max_samples=48",
        "--data.init_args.batch_size=16", "--data.init_args.n_local_views=2", "--search.max_evaluations=4",
        "--search.popsize=2", "--search.num_images=32", "--search.batch_size=32", "--search.pca_components=8",
        "--export.split_grid=0", "--export.latency_batch_size=2", "--evaluation.metrics=[]",
        "--report.print_table=false", "--report.plots=false", "--progress=off", "--trainer.accelerator=cpu"]


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> dict[str, Path]:
    """One small run's files: its scores, a model, its latency table and resume state, a fine-tune's checkpoint."""
    root = tmp_path_factory.mktemp("genuine")
    run = root / "run"
    # the latency table is written when a latency budget is resolved: ask for one the model surely meets
    assert main(["prune", "--out_dir", str(run), *TINY, "--export.budgets=[{flops: 0.6}, {latency: 1000}]"]) == 0
    model = next(p for p in (run / "models").iterdir() if p.name == "flops0.6")
    finetune = root / "finetune"
    assert main(["train", "fit", "--config", "finetune_pruned", f"--model.checkpoint={model}",
                 f"--trainer.default_root_dir={finetune}", "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
                 "--trainer.enable_progress_bar=false", "--trainer.accelerator=cpu", "--data.init_args.batch_size=8",
                 "--data.init_args.max_samples=32"]) == 0
    (checkpoint,) = finetune.rglob("last.ckpt")
    return {"run": run, "model": model, "checkpoint": checkpoint, "finetune": finetune}


# -- mutations of a nested structure -------------------------------------------------------------------------------
EXTREMES = [None, True, False, "", "x", "2", -1, 0, 1, 3, 2 ** 31, 10 ** 13, -10 ** 13, 1e308, -1e-300, 0.5,
            float("nan"), float("inf"), float("-inf"), [], {}, [1, 2, 3], {"a": 1}, [[[[[[[[0]]]]]]]]]
VERSIONS = [None, 0, 1, 2, 3, "1", "2", 2.0, True, -1]


def _paths(tree, prefix=()):
    """Every node's path (keys and indices) in a nested structure of dicts, lists and tuples."""
    yield prefix
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            yield from _paths(value, (*prefix, index))


def _get(tree, path):
    for step in path:
        tree = tree[step]
    return tree


def _set(tree, path, value, delete: bool = False):
    """``tree`` with the node at ``path`` replaced (or deleted); tuples become lists on the way."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, tuple):
        tree = list(tree)
    if not rest and delete:
        del tree[head]
        return tree
    tree[head] = _set(tree[head], rest, value, delete)
    return tree


@st.composite
def tree_mutation(draw, tree):
    """(description, mutated tree) of one edit at one node."""
    paths = list(_paths(tree))
    path = draw(st.sampled_from(paths))
    node = _get(tree, path)
    kinds = ["replace", "swap"] + (["delete"] if path else []) + (["scale"] if torch.is_tensor(node) or (
        isinstance(node, (int, float)) and not isinstance(node, bool)) else []) + ["version"]
    kind = draw(st.sampled_from(kinds))
    tree = copy.deepcopy(tree)
    if kind == "delete":
        return f"delete {path}", _set(tree, path, None, delete=True)
    if kind == "version":
        if isinstance(tree, dict):
            tree["version"] = draw(st.sampled_from(VERSIONS))
        return "version", tree
    if kind == "scale":
        factor = draw(st.sampled_from([-1.0, 0.0, 1e6, float("nan"), float("inf")]))
        if torch.is_tensor(node):
            changed = node * factor if node.is_floating_point() else node.flip(0) if node.ndim else node + 1
        else:
            changed = node * factor if isinstance(node, float) or not math.isfinite(factor) else int(node * factor)
        return f"scale {path} by {factor}", _set(tree, path, changed)
    if kind == "swap":
        changed = draw(st.sampled_from([str(node)[:40], [node], {"value": node}])) if not torch.is_tensor(node) else \
            draw(st.sampled_from([node.reshape(1, -1), node.double(), node.reshape(-1)[:0], node.tolist()]))
        return f"swap {path}", _set(tree, path, changed)
    return f"replace {path}", _set(tree, path, draw(st.sampled_from(EXTREMES)))


@st.composite
def byte_mutation(draw, size: int):
    """(description, function of the file's bytes)."""
    kind = draw(st.sampled_from(["truncate", "flip", "append", "nest", "empty"]))
    at = draw(st.integers(0, max(0, size - 1)))
    if kind == "truncate":
        return f"truncate at {at}", lambda data: data[:at]
    if kind == "flip":
        return f"flip byte {at}", lambda data: data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:]
    if kind == "append":
        return "append", lambda data: data + b"\x00garbage"
    if kind == "nest":
        return "nest", lambda data: b"[" * 200_000 + b"]" * 200_000
    return "empty", lambda data: b""


def _json(path: Path):
    return json.loads(path.read_text())


def _write_json(content, path: Path) -> None:
    path.write_text(json.dumps(content))


def _torch(path: Path):
    return torch.load(path, weights_only=True)


def _wrote_bytes_mutant(data, source: Path, target: Path) -> bool:
    """Whether a mutant of ``source``'s bytes (drawn or not) was written to ``target``."""
    if not data.draw(st.booleans(), "bytes"):
        return False
    what, change = data.draw(byte_mutation(source.stat().st_size))
    target.write_bytes(change(source.read_bytes()))
    return True


def _write_mutant(data, source: Path, target: Path, read=_json, write=_write_json, key: str = CHECKSUM_KEY,
                  sign=with_checksum) -> None:
    """Write a mutant of ``source`` to ``target``: its bytes changed, or one edit of its content (``read``) written
    back (``write``) with the old checksum (under ``key``) or re-signed (``sign``)."""
    if _wrote_bytes_mutant(data, source, target):
        return
    content = read(source)
    what, mutated = data.draw(tree_mutation({k: v for k, v in content.items() if k != key}))
    if isinstance(mutated, dict):
        mutated = sign(mutated) if data.draw(st.booleans(), "re-signed") else {**mutated, key: content[key]}
    write(mutated, target)


def _refused_or(result, genuine, use) -> str:
    """What became of a mutant (an event for the statistics); fails on anything but the three outcomes."""
    try:
        value = result()
    except SnapViTError as err:
        assert "\n" not in str(err).strip(), f"an error of several lines: {err}"
        return "refused"
    if genuine(value):
        return "genuine"
    try:
        use(value)
    except SnapViTError as err:  # refused where it is used (as the command that uses it would: one error line)
        assert "\n" not in str(err).strip(), f"an error of several lines: {err}"
        return "refused when used"
    return "accepted, usable"


# -- the kinds -------------------------------------------------------------------------------------------------------
def _record_reader(folder: Path):
    from snapvit_pl.models import load_pruned

    return load_pruned(folder)


def _run_model(loaded) -> None:
    model, _ = loaded
    with torch.no_grad():
        out = model(torch.randn(2, 1, 28, 28))
    assert out.shape[0] == 2


def _same_record(reference):
    return lambda loaded: loaded[1] == reference[1] and all(
        torch.equal(a, b) for a, b in zip(loaded[0].state_dict().values(), reference[0].state_dict().values()))


@given(data=st.data())
@MUTATION
def test_architecture_records(genuine, tmp_path_factory, data):
    reference = _record_reader(genuine["model"])
    folder = tmp_path_factory.mktemp("record")
    shutil.copytree(genuine["model"], folder, dirs_exist_ok=True)
    _write_mutant(data, genuine["model"] / "architecture.json", folder / "architecture.json")
    event(f"record: {_refused_or(lambda: _record_reader(folder), _same_record(reference), _run_model)}")


@given(data=st.data())
@MUTATION
def test_model_weights(genuine, tmp_path_factory, data):
    reference = _record_reader(genuine["model"])
    folder = tmp_path_factory.mktemp("weights")
    shutil.copytree(genuine["model"], folder, dirs_exist_ok=True)
    weights = (folder / "model.safetensors").read_bytes()
    what, change = data.draw(byte_mutation(len(weights)))
    (folder / "model.safetensors").write_bytes(change(weights))
    event(f"weights: {_refused_or(lambda: _record_reader(folder), _same_record(reference), _run_model)}")


def _scores_parts(path: Path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        header = json.loads(f.metadata()["snapvit"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return header, tensors


@given(data=st.data())
@MUTATION
def test_elastic_scores(genuine, tmp_path_factory, data):
    from snapvit_pl.elastic import Budget, ElasticScores, ElasticViT
    from snapvit_pl.models import BackboneSpec, load_backbone

    source = genuine["run"] / "elastic_scores.safetensors"
    reference = ElasticScores.load(source)
    path = tmp_path_factory.mktemp("scores") / "scores.safetensors"
    if not _wrote_bytes_mutant(data, source, path):
        header, tensors = _scores_parts(source)
        recorded = header.pop(CHECKSUM_KEY)
        if data.draw(st.booleans(), "in the header"):
            what, header = data.draw(tree_mutation(header))
        else:
            what, tensors = data.draw(tree_mutation(tensors))
        tensors = tensors if isinstance(tensors, dict) and all(torch.is_tensor(t) for t in tensors.values()) else {
            "heads.0": torch.zeros(4)}  # (safetensors holds tensors only)
        tensors = {k: t.contiguous() for k, t in tensors.items()}
        if isinstance(header, dict):
            header[CHECKSUM_KEY] = content_digest({"header": header, "tensors": tensors}) \
                if data.draw(st.booleans(), "re-signed") else recorded
        save_file(tensors, str(path), metadata={"snapvit": json.dumps(header)})

    def same(scores) -> bool:
        return all(torch.equal(a, b) for a, b in zip(scores.head_scores + scores.neuron_scores,
                                                     reference.head_scores + reference.neuron_scores)) \
            and scores.base == reference.base and scores.splits.to_dict() == reference.splits.to_dict() and \
            len(scores.head_scores) == len(reference.head_scores)

    def cut(scores) -> None:  # a budget cut from the scores on the base they describe (when it is the run's)
        if scores.base == reference.base:
            base = load_backbone(BackboneSpec.from_dict(scores.base))
            ElasticViT(base, scores).set_budget(Budget(sparsity=0.3))

    event(f"scores: {_refused_or(lambda: ElasticScores.load(path), same, cut)}")


@given(data=st.data())
@MUTATION
def test_latency_tables(genuine, tmp_path_factory, data):
    from types import SimpleNamespace

    from snapvit_pl.elastic.latency import LatencyTable

    source = genuine["run"] / "latency_table.json"
    reference = LatencyTable.load(source)
    path = tmp_path_factory.mktemp("latency") / "latency_table.json"
    _write_mutant(data, source, path)

    def predict(table) -> None:  # every kept count of every block, as the budget's search asks
        arch = table.architecture
        for fraction in (0.0, 0.5, 1.0):
            subnet = SimpleNamespace(head_counts=[max(1, round(h * fraction)) for h in arch["heads"]],
                                     neuron_counts=[max(1, round(n * fraction)) for n in arch["mlp_hidden"]])
            value = table.predict(subnet)
            assert math.isfinite(value) and value >= 0, value

    event(f"latency: {_refused_or(lambda: LatencyTable.load(path), lambda t: t == reference, predict)}")


@given(data=st.data())
@MUTATION
def test_resume_states(genuine, tmp_path_factory, data):
    from snapvit_pl.run.names import RESUME_FILE
    from snapvit_pl.run.resume import check_resume_state, load_resume_state
    from snapvit_pl.pipeline.state import Timings
    from snapvit_pl.scoring.base import LocalScores
    from snapvit_pl.search.loop import SearchProgress

    run = tmp_path_factory.mktemp("resume")
    shutil.copy(genuine["run"] / "config.yaml", run / "config.yaml")
    source = genuine["run"] / RESUME_FILE
    widths = {"heads": [4, 4], "mlp_hidden": [128, 128]}
    stages = [f.name for f in fields(Timings)]

    def read():
        state = load_resume_state(run)
        check_resume_state(state, widths, stages, run / RESUME_FILE)
        return state

    _write_mutant(data, source, run / RESUME_FILE, _torch, torch.save)
    reference = torch.load(source, weights_only=True)

    def use(state) -> None:  # what Pipeline.load_state_dict builds from it
        if state.get("local") is not None:
            LocalScores.from_dict(state["local"])
        if state.get("search") is not None:
            SearchProgress.from_dict(state["search"])
        Timings(**state.get("timings", {}))
        float(state.get("elapsed_s", 0.0))

    event(f"resume: {_refused_or(read, lambda s: content_digest(s) == content_digest(reference), use)}")


@given(data=st.data())
@MUTATION
def test_training_checkpoints(genuine, tmp_path_factory, data):
    """Through the readers train.py applies before Lightning loads anything (the file check, the model check) and
    the module's own on_load_checkpoint (checksum, weights' names and shapes, RNG states)."""
    from snapvit_pl.cli.train import check_ckpt_file, check_ckpt_model
    from snapvit_pl.lightning.training import _SEAL_KEY, _SEALED

    source, model = genuine["checkpoint"], str(genuine["model"])
    path = tmp_path_factory.mktemp("ckpt") / "last.ckpt"
    _write_mutant(data, source, path, _torch, torch.save, _SEAL_KEY,
                  lambda content: {**content, _SEAL_KEY: content_digest({k: content.get(k) for k in _SEALED})})
    module = _finetune_module(model)

    def read():
        check_ckpt_file(str(path))
        check_ckpt_model(str(path), {"checkpoint": model, "model_name": None, "model_kwargs": None})
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        module.on_load_checkpoint(checkpoint)
        return checkpoint

    def use(checkpoint) -> None:  # what Lightning then loads into the module
        module.load_state_dict({k: v for k, v in checkpoint["state_dict"].items()}, strict=True)

    reference = torch.load(source, weights_only=True)
    outcome = _refused_or(read, lambda c: content_digest({k: c.get(k) for k in _SEALED})
                          == content_digest({k: reference.get(k) for k in _SEALED}), use)
    event(f"checkpoint: {outcome}")


_MODULES: dict = {}


def _finetune_module(model: str):
    from snapvit_pl.lightning.finetune_module import FinetuneModule

    if model not in _MODULES:
        _MODULES[model] = FinetuneModule(checkpoint=model, loss="both")
    return _MODULES[model]


# -- through the command line ----------------------------------------------------------------------------------------
def _one_line(capsys, code: int) -> str:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    return errors[0]


def test_mutants_through_the_command_line(genuine, tmp_path, capsys):
    """One crafted (re-signed) mutant and one edited copy per kind, through the command that reads it: one error
    line, exit 2, and nothing written."""
    from snapvit_pl.run.names import RESUME_FILE

    capsys.readouterr()
    # an architecture record re-signed with a string where the head counts go
    folder = tmp_path / "model"
    shutil.copytree(genuine["model"], folder)
    record = json.loads((folder / "architecture.json").read_text())
    record.pop(CHECKSUM_KEY)
    record["heads"] = "4,1"
    (folder / "architecture.json").write_text(json.dumps(with_checksum(record)))
    out = tmp_path / "eval.json"
    assert "heads" in _one_line(capsys, main(["evaluate", "--checkpoint", str(folder), "--device=cpu",
                                              "--evaluation.metrics=[]", "--out", str(out)]))
    assert not out.exists()
    # a scores file whose bytes were cut
    scores = tmp_path / "scores.safetensors"
    scores.write_bytes((genuine["run"] / "elastic_scores.safetensors").read_bytes()[:-50])
    _one_line(capsys, main(["extract", "--scores", str(scores), "--out_dir", str(tmp_path / "cut"), "--progress=off",
                            "--export.budgets=[{flops: 0.6}]"]))
    assert not (tmp_path / "cut").exists()
    # a latency table re-signed with a negative time, given to extract for a latency budget
    table = json.loads((genuine["run"] / "latency_table.json").read_text())
    table.pop(CHECKSUM_KEY)
    table["dense_ms"] = -1.0
    (tmp_path / "latency.json").write_text(json.dumps(with_checksum(table)))
    assert "dense_ms" in _one_line(capsys, main(
        ["extract", "--scores", str(genuine["run"] / "elastic_scores.safetensors"), "--out_dir", str(tmp_path / "lat"),
         "--progress=off", "--export.budgets=[{latency: 1000}]", f"--export.latency_table={tmp_path / 'latency.json'}",
         "--export.latency_device=cpu", "--export.latency_batch_size=2"]))
    assert not (tmp_path / "lat").exists()
    # a resume state with its version removed
    run = tmp_path / "run"
    shutil.copytree(genuine["run"], run, ignore=shutil.ignore_patterns("report.json", "models", "elastic_scores*"))
    state = torch.load(run / RESUME_FILE, weights_only=True)
    state["elapsed_s"] = "abc"
    torch.save(state, run / RESUME_FILE)
    before = sorted(p.name for p in run.iterdir())
    _one_line(capsys, main(["prune", "--resume", str(run), "--progress=off"]))
    assert sorted(p.name for p in run.iterdir()) == before
    # a training checkpoint without its checksum
    checkpoint = torch.load(genuine["checkpoint"], weights_only=True)
    checkpoint.pop("snapvit_sha256")
    torch.save(checkpoint, tmp_path / "unsealed.ckpt")
    finetune = tmp_path / "finetune"
    assert "no snapvit-pl checksum" in _one_line(capsys, main(
        ["train", "fit", "--config", "finetune_pruned", f"--model.checkpoint={genuine['model']}",
         f"--trainer.default_root_dir={finetune}", "--trainer.max_steps=4", "--trainer.limit_val_batches=1",
         "--trainer.enable_progress_bar=false", "--trainer.accelerator=cpu", "--data.init_args.batch_size=8",
         "--data.init_args.max_samples=32", "--ckpt_path", str(tmp_path / "unsealed.ckpt")]))
    assert not (finetune / "model").exists()
