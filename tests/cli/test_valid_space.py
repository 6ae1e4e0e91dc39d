"""Property-based tests of the *valid* command space of ``python prune.py``, on a tiny random-weight ViT.

Hypothesis draws whole command lines (seeds at their boundaries, 1-3 budgets of every kind or the default ones,
every scorer of :data:`snapvit_pl.scoring.SCORERS`, the allocation / split / rounding / correction / evaluation
settings) and runs each as users run it, ``python prune.py ...`` in a subprocess. The choices come from the parser's
own option schema (``prune_options.json``, :func:`snapvit_pl.cli.help.load_options`) wherever it lists them; a list
written here is checked to be a subset of the schema's. On every draw:

1. the run ends with status 0, or with status 2, exactly one stderr line starting with ``error:`` and nothing left in
   ``--out_dir``; any other status or a traceback fails;
2. every budget is met: a sparsity / params / FLOPs budget's cost never exceeds its target and lies within one unit
   step of it once the bisection cut anything (README, "Budgets": "within one unit's cost"; the step is
   ``mlp_multiple`` neurons and one head), a latency budget's predicted latency never exceeds it, a ratio pair
   removes exactly the heads it asks and the neurons it asks give or take the recorded ``rounding``;
3. every saved model keeps the protected units of each block (:func:`snapvit_pl.models.units.min_kept` of the run's
   keep ratios), and its MLP widths are multiples of ``export.mlp_multiple`` (or the block's full width);
4. ``report.json`` describes exactly the files on disk: its models and no others, their checksums, sizes and
   widths (the models are loaded back), the scores file, which gives the same models again.

A second test runs the same draw on one and on two processes (``--trainer.devices 2``, gloo on CPU) and wants the
same scores file and model files, byte for byte.

CI runs a fixed (derandomized) set of examples, 10 draws and 2 two-process draws, in about two minutes (profile
``valid-space-ci``). A longer local run, with fresh examples on every run (profile ``long``)::

    SNAPVIT_HYPOTHESIS_PROFILE=long OMP_NUM_THREADS=1 python -m pytest tests/cli/test_valid_space.py -n 0 -q

(``SNAPVIT_HYPOTHESIS_EXAMPLES=N`` sets its example count, default 60; the two-process test runs a quarter as many;
``--hypothesis-show-statistics`` counts the finished and the refused draws.) Neither profile shrinks a failure (a run
takes seconds): the failure message gives the command line to minimise by hand.

Valid commands that break an invariant today are listed in :data:`KNOWN_BUGS`: kept out of the draws and pinned by
strict xfail tests, so that a fix shows as an XPASS failure and the draws can take them back.
"""
from __future__ import annotations

import functools
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from run_helpers import digests, env
from snapvit_pl.cli.help import load_options
from snapvit_pl.cli.prune import declared_option_hints
from snapvit_pl.elastic import ElasticScores
from snapvit_pl.elastic.budget import Budget, CostModel, default_budgets
from snapvit_pl.elastic.ranking import removed_count
from snapvit_pl.eval.suite import METRICS
from snapvit_pl.models import BackboneSpec, count_params, flop_counts, load_backbone, load_pruned
from snapvit_pl.models.checkpoint import RECORD, WEIGHTS
from snapvit_pl.models.units import MIN_HEAD_KEEP, MIN_MLP_KEEP, Subnet, min_kept
from snapvit_pl.run.names import RUN_DIR_NAMES
from snapvit_pl.pipeline.state import MEASURED_KEYS
from snapvit_pl.progress import MODES
from snapvit_pl.ranges import Choices, range_types
from snapvit_pl.scoring import SCORERS
from snapvit_pl.seeding import SEED_RANGE

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="apt-get install dataset-fashion-mnist"),
]

# -- the examples' budget: CI (fixed examples) and a long local run -------------------------------------------------
_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
               print_blob=True)
# No shrinking in either: a run takes 5-10 s, and shrinking one failure took over five minutes; a failure prints its
# command line, which is minimised by hand.
settings.register_profile("valid-space-ci", max_examples=10, derandomize=True, database=None,
                          phases=[Phase.explicit, Phase.generate], **_COMMON)
settings.register_profile("long", max_examples=int(os.environ.get("SNAPVIT_HYPOTHESIS_EXAMPLES", "60")),
                          phases=[Phase.explicit, Phase.reuse, Phase.generate], **_COMMON)
_PROFILE = os.environ.get("SNAPVIT_HYPOTHESIS_PROFILE", "valid-space-ci")
#: Applied per test (not loaded globally: other test files keep Hypothesis's defaults).
SETTINGS = settings.get_profile(_PROFILE)
DDP_SETTINGS = settings(SETTINGS, max_examples=2 if _PROFILE == "valid-space-ci" else max(2, SETTINGS.max_examples // 4))

# -- the tiny base command --------------------------------------------------------------------------------------------
BASE: dict[str, Any] = {
    "model.checkpoint_path": None, "model.model_kwargs.embed_dim": 32, "model.model_kwargs.depth": 2,
    "model.model_kwargs.num_heads": 4, "data.init_args.max_samples": 48, "data.init_args.batch_size": 16,
    "search.num_images": 32, "search.batch_size": 32, "search.pca_components": 8, "export.split_grid": 0,
    "evaluation.metrics": [], "report.print_table": False, "progress": "off", "trainer.accelerator": "cpu",
}
OPTIONS = load_options()
#: Each option's words, from the settings' declarations (the one check of a choice is theirs: the parser reads a word).
CHOICES: dict[str, list[str]] = {key: list(found.words) for key, hint in declared_option_hints().items()
                                 for found in range_types(hint) if isinstance(found, Choices)}
#: Cheap metrics (no segmentation data needed); checked against the evaluation's own list.
CHEAP_METRICS = ("knn", "head", "linear", "throughput")
#: The values of ``correction.enabled`` (a Union the schema lists no choices for; its help says BOOL|{auto}).
CORRECTION_ENABLED = (False, True, "auto")


def test_hard_coded_choices_belong_to_the_schema():
    """Every option drawn below is one of the parser's, and every hand-written choice list is within the schema's."""
    options = set(OPTIONS["options"])
    drawn = {*BASE, "seed_everything", "data.init_args.seed", "search.seed", "model.seed", "importance.scorer",
             "importance.min_mlp_keep", "importance.min_head_keep", "search.max_evaluations", "search.popsize",
             "export.budgets", "export.save_models", "export.split_candidates", "export.split_step",
             "export.split_images", "export.latency_batch_size", "export.mlp_multiple", "correction.enabled",
             "correction.num_samples", "correction.held_out", "correction.batch_size", "evaluation.train_samples", "evaluation.val_samples",
             "evaluation.throughput_batch_size", "evaluation.throughput_repeats", "report.plots"}
    known = lambda key: any(".".join(key.split(".")[:n]) in options for n in range(1, key.count(".") + 2))  # noqa: E731
    assert all(known(key) for key in drawn), sorted(key for key in drawn if not known(key))  # (data: its init_args)
    assert all(key in options for key in drawn if not key.startswith(("data.", "model.model_kwargs.")))
    for key in ("importance.allocation", "export.split", "search.optimizer", "search.parametrization",
                "correction.method", "correction.damping"):
        assert CHOICES[key] and f"one of {', '.join(CHOICES[key])}" in OPTIONS["text"], key  # --help shows them
    assert set(CHEAP_METRICS) <= set(METRICS)
    assert BASE["progress"] in MODES
    assert "auto" in OPTIONS["text"].split("--correction.enabled", 1)[1].split("\n", 1)[0]
    for key in ("data.init_args.seed", "search.seed", "model.seed"):  # the seeds drawn span the options' range
        line = OPTIONS["text"].split(f"--{key} ", 1)[1].split("\n", 1)[0]
        assert f">= {SEED_RANGE[0]} and <= {SEED_RANGE[1]}" in line, line


# -- the dense model's sizes (the same architecture in every draw: the weights do not change a cost) -----------------
def _tiny_spec() -> dict[str, Any]:
    """The base model of the tiny command (demo.yaml's, made smaller), as ``BackboneSpec.to_dict`` writes it."""
    import yaml

    model = yaml.safe_load((ROOT / "configs" / "prune" / "demo.yaml").read_text())["model"]
    kwargs = {**model["model_kwargs"], **{k.split(".")[-1]: v for k, v in BASE.items() if ".model_kwargs." in k}}
    return {"model_name": model["model_name"], "pretrained": False, "checkpoint_path": None, "model_kwargs": kwargs,
            "seed": 0}


_TINY_SPEC = _tiny_spec()


@functools.cache
def dense_cost() -> CostModel:
    return CostModel(load_backbone(BackboneSpec.from_dict(_TINY_SPEC)))


# -- drawing command lines --------------------------------------------------------------------------------------------
@dataclass
class Draw:
    """A command line, and how it is run (issue 48's classes of the valid space: none may change its outcome): its
    reader of the standard output gone after one line (``| head -1``), its options read from a config file that
    uses YAML's merge key, the C locale without UTF-8 mode with a non-ASCII run directory."""

    options: dict[str, Any]
    out_dir_exists: bool = False
    budgets: Optional[list[dict[str, Any]]] = field(default=None)
    closed_stdout: bool = False
    via_config: bool = False
    c_locale: bool = False

    def argv(self, out_dir: Path, **extra: Any) -> list[str]:
        options = {**BASE, **self.options, **extra}
        if self.closed_stdout:
            options["report.print_table"] = True  # something to read one line of
        if not self.via_config:
            return [f"--{key}={_text(value)}" for key, value in options.items()] + ["--out_dir", str(out_dir)]
        config = out_dir.parent / "draw.yaml"
        config.write_text(_merged_yaml(options))
        return ["--config", "demo", "--config", str(config), "--out_dir", str(out_dir)]


def _merged_yaml(options: dict[str, Any]) -> str:
    """``options`` as a config file, its first section written with YAML's merge key (``<<: {...}``)."""
    import yaml

    nested: dict[str, Any] = {}
    for key, value in options.items():
        *groups, leaf = key.split(".")
        target = nested
        for group in groups:
            target = target.setdefault(group, {})
        target[leaf] = value
    merged = next(key for key, value in nested.items() if isinstance(value, dict))
    text = f"{merged}:\n  <<: {json.dumps(nested.pop(merged))}\n"
    return text + yaml.safe_dump(nested, sort_keys=False)


def _text(value: Any) -> str:
    """A value as the command line writes it (YAML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def _fraction(low: float, high: float) -> st.SearchStrategy[float]:
    """A fraction in [low, high], its ends included, rounded to 4 digits (budgets of one label are refused)."""
    return st.one_of(st.sampled_from([low, high]), st.floats(low, high).map(lambda x: round(x, 4)))


@st.composite
def budget(draw, latency: bool = True) -> dict[str, Any]:
    dense = dense_cost()
    kinds = ["sparsity", "params", "params_count", "flops", "flops_count", "ratios"] + (["latency"] if latency else [])
    kind = draw(st.sampled_from(kinds))
    # (the lower ends are within reach of the default keep ratios, not of every drawn one: some draws are refused)
    if kind == "sparsity":
        return {"sparsity": draw(_fraction(0.0, 0.7))}
    if kind in ("params", "flops"):
        return {kind: draw(_fraction(0.3, 1.0))}
    if kind in ("params_count", "flops_count"):  # an absolute count, from the dense model's
        metric = kind.split("_")[0]
        total = dense.dense_params if metric == "params" else dense.dense_flops
        return {metric: int(round(total * draw(_fraction(0.3, 1.0))))}
    if kind == "latency":  # ms per batch: met by the dense model, unreachable, or around the tiny model's
        return {"latency": draw(st.sampled_from([1000.0, 0.001]) | st.floats(0.2, 3.0).map(lambda x: round(x, 3)))}
    pair = {"mlp_ratio": draw(_fraction(0.0, 0.9)), "head_ratio": draw(_fraction(0.0, 0.75))}
    which = draw(st.sampled_from(["both", "mlp_ratio", "head_ratio"]))
    return pair if which == "both" else {which: pair[which]}


def _seed() -> st.SearchStrategy[int]:
    low, high = SEED_RANGE
    return st.sampled_from([low, 2**31 - 1, high]) | st.integers(low, high)


@st.composite
def commands(draw, ddp: bool = False) -> Draw:
    """A valid command line. ``ddp``: one whose result does not depend on measured times (no latency budget, no
    throughput metric) nor on a random seed, so that one and two processes can be compared."""
    o: dict[str, Any] = {}
    maybe = lambda: draw(st.booleans())  # noqa: E731
    # (true, a random seed drawn and recorded, only where one and two processes are not compared)
    o["seed_everything"] = draw(_seed() if ddp else _seed() | st.just(False) | st.just(True))
    for key in ("data.init_args.seed", "search.seed", "model.seed"):
        if maybe():
            o[key] = draw(_seed())
    scorer = draw(st.sampled_from(sorted(n for n, c in SCORERS.items() if c.__module__.startswith("snapvit_pl."))))
    if scorer != "sensitivity" or maybe():
        o["importance.scorer"] = f"snapvit_pl.scoring.{SCORERS[scorer].__name__}"
    o["importance.allocation"] = draw(st.sampled_from(CHOICES["importance.allocation"]))
    if not ddp and maybe():  # (the two-process draws keep the defaults: fewer of them refused, more compared)
        o["importance.min_mlp_keep"] = draw(st.sampled_from([0.0, MIN_MLP_KEEP, 0.1, 0.3]))
    if not ddp and maybe():
        o["importance.min_head_keep"] = draw(st.sampled_from([0.0, MIN_HEAD_KEEP, 0.25, 0.5]))
    if draw(st.integers(0, 3)) == 0:  # a short coefficient search
        o["search.max_evaluations"] = draw(st.sampled_from([4, 8]))
        o["search.popsize"] = 4
        o["search.optimizer"] = draw(st.sampled_from(CHOICES["search.optimizer"]))
        o["search.parametrization"] = draw(st.sampled_from(CHOICES["search.parametrization"]))
    out_dir_exists = maybe()
    budgets = None
    if draw(st.integers(0, 9)) > 0:  # else the default budgets
        budgets = draw(st.lists(budget(latency=not ddp), min_size=1, max_size=3))
        o["export.budgets"] = budgets
    if any("latency" in b for b in budgets or []):
        o["export.latency_batch_size"] = draw(st.sampled_from([1, 4]))
    o["export.split"] = draw(st.sampled_from(CHOICES["export.split"]))
    if o["export.split"] == "fitness":
        o["export.split_candidates"] = draw(st.integers(1, 4))
        o["export.split_step"] = draw(st.sampled_from([0.05, 0.1, 0.25]))
        o["export.split_grid"] = draw(st.sampled_from([0, 0.1]))
        o["export.split_images"] = draw(st.sampled_from([8, 16, 32]))
    o["export.mlp_multiple"] = draw(st.sampled_from([1, 4, 8]))
    if draw(st.integers(0, 5)) == 0:
        o["export.save_models"] = False
    o["correction.enabled"] = draw(st.sampled_from(CORRECTION_ENABLED))
    if o["correction.enabled"] is not False:
        o["correction.method"] = draw(st.sampled_from(CHOICES["correction.method"]))
        o["correction.damping"] = draw(st.sampled_from(CHOICES["correction.damping"]))
        o["correction.num_samples"] = draw(st.sampled_from([8, 16]))
        o["correction.held_out"] = draw(st.sampled_from([0.0, 0.1, 0.25]))
        o["correction.batch_size"] = 8
    metrics = draw(st.just([]) | st.lists(st.sampled_from([m for m in CHEAP_METRICS if not ddp or m != "throughput"]),
                                          min_size=1, max_size=2, unique=True))
    o["evaluation.metrics"] = metrics
    if metrics:
        o.update({"evaluation.train_samples": 64, "evaluation.val_samples": 32})
    if "throughput" in metrics:
        o.update({"evaluation.throughput_batch_size": 4, "evaluation.throughput_repeats": 2})
    o["report.plots"] = maybe()
    how = {} if ddp else {k: draw(st.integers(0, 3)) == 0 for k in ("closed_stdout", "via_config", "c_locale")}
    return Draw(o, out_dir_exists=out_dir_exists, budgets=budgets, **how)


# -- running ----------------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prune(draw: Draw, out_dir: Path, **extra: Any) -> tuple[subprocess.CompletedProcess, str]:
    argv = draw.argv(out_dir, **extra)
    variables = {"LC_ALL": "C", "PYTHONUTF8": "0"} if draw.c_locale else {}
    command = " ".join([*(f"{k}={v}" for k, v in variables.items()), shlex.join(["python", "prune.py", *argv]),
                        *(["| head -1"] if draw.closed_stdout else [])])
    process = subprocess.Popen([sys.executable, str(ROOT / "prune.py"), *argv], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env(MASTER_PORT=str(_free_port()), **variables))
    if draw.closed_stdout:  # the reader has the first line, then goes away
        process.stdout.readline()
        process.stdout.close()
    out, err = process.communicate(timeout=400)
    result = subprocess.CompletedProcess(process.args, process.returncode, (out or b"").decode(errors="replace"),
                                         err.decode(errors="replace"))
    return result, command


def _failure(command: str, result: subprocess.CompletedProcess, what: str) -> str:
    return f"{what}\ncommand: {command}\nexit status {result.returncode}\nstderr (tail):\n{result.stderr[-4000:]}"


# -- the invariants ---------------------------------------------------------------------------------------------------
def check_run(draw: Draw, out_dir: Path, result: subprocess.CompletedProcess, command: str) -> Optional[dict]:
    """Invariants 1-4 of the module docstring; returns the report (None for a refused run)."""
    if result.returncode == 2:  # 1. a refusal: one line, nothing left behind
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), _failure(command, result, "refusal is not one line")
        left = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*")) if out_dir.exists() else []
        assert not left, _failure(command, result, f"a refused run left {left} in --out_dir")
        return None
    assert result.returncode == 0 and "Traceback" not in result.stderr, _failure(command, result, "the run failed")
    report = json.loads((out_dir / "report.json").read_text())
    try:
        _check_models(draw, out_dir, report)
    except AssertionError as err:
        raise AssertionError(f"{err}\ncommand: {command}") from None
    return report


def _check_models(draw: Draw, out_dir: Path, report: dict) -> None:
    cost = dense_cost()
    o = {**BASE, **draw.options}
    multiple = o["export.mlp_multiple"]
    min_mlp, min_head = o.get("importance.min_mlp_keep", MIN_MLP_KEEP), o.get("importance.min_head_keep", MIN_HEAD_KEEP)
    budgets = default_budgets() if draw.budgets is None else [Budget.parse(b) for b in draw.budgets]
    entries = report["pruned"]
    assert [e["label"] for e in entries] == [b.label() for b in budgets], "the report's models are not the budgets"
    assert report["dense"]["params"] == cost.dense_params and report["dense"]["flops"] == cost.dense_flops

    # 4. the files: the scores file, exactly the models listed, nothing else at the top of the run directory
    assert report["scores_file"] == "elastic_scores.safetensors"
    scores = ElasticScores.load(out_dir / report["scores_file"])  # (its checksum verified)
    assert scores.mlp_multiple == multiple and (scores.min_mlp_keep, scores.min_head_keep) == (min_mlp, min_head)
    top = {p.name for p in out_dir.iterdir()}
    assert top <= {*RUN_DIR_NAMES, report["scores_file"]}, f"unexpected files in the run directory: {sorted(top)}"
    on_disk = sorted(p.name for p in (out_dir / "models").iterdir()) if (out_dir / "models").exists() else []
    saved = o.get("export.save_models", True)
    listed = sorted(e["label"] for e in entries if "checkpoint" in e)
    assert on_disk == listed, f"models on disk {on_disk}, in the report {listed}"
    assert listed == (sorted(b.label() for b in budgets) if saved else []), f"save_models {saved}, listed {listed}"
    metrics = o["evaluation.metrics"]

    for budget, e in zip(budgets, entries):
        heads, widths = e["heads"], e["mlp_hidden"]
        where = f"model {e['label']} (budget {budget.describe()}: heads {heads}, MLP widths {widths})"
        assert e["params"] == cost.params(_counts(heads, widths)) and e["flops"] == cost.flops(_counts(heads, widths))
        assert bool(e.get("metrics")) == bool(metrics), f"{where}: metrics {e.get('metrics')} for {metrics}"
        # 3. the protected units, the width rounding
        for b, (h, n, H, N) in enumerate(zip(heads, widths, cost.num_heads, cost.num_neurons)):
            assert min_kept(H, min_head) <= h <= H, f"{where}: block {b} keeps {h} of {H} heads (min {min_head})"
            assert min_kept(N, min_mlp) <= n <= N, f"{where}: block {b} keeps {n} of {N} neurons (min {min_mlp})"
            assert n % multiple == 0 or n == N, f"{where}: block {b} width {n} is no multiple of {multiple}"
        if multiple == 1:
            assert "rounding" not in e, f"{where}: rounding {e['rounding']} without mlp_multiple"
        # 2. the budget
        _check_budget(budget, e, cost, multiple, where)
        # the scores file gives the same model again (a latency budget needs the run's measured table)
        if budget.latency is None:
            subnet = scores.subnet(budget, cost)[0]
            assert (subnet.head_counts, subnet.neuron_counts) == (heads, widths), f"{where}: re-extracted differently"
        # 4. the saved model: its record, checksums (load_pruned verifies them), sizes, widths
        if "checkpoint" in e:
            directory = out_dir / e["checkpoint"]
            assert e["checkpoint"] == f"models/{e['label']}" and directory.is_dir(), f"{where}: {e['checkpoint']}"
            assert {p.name for p in directory.iterdir()} == {WEIGHTS, RECORD}, f"{where}: {sorted(directory.iterdir())}"
            model, record = load_pruned(directory)
            extra = record["extra"]
            assert (record["heads"], record["mlp_hidden"]) == (heads, widths), f"{where}: record {record['heads']}"
            assert {k: extra[k] for k in ("label", "budget", "params", "flops", "heads", "mlp_hidden")} == \
                {k: e[k] for k in ("label", "budget", "params", "flops", "heads", "mlp_hidden")}, where
            assert extra.get("rounding") == e.get("rounding"), f"{where}: rounding {extra.get('rounding')}"
            assert count_params(model) == e["params"], f"{where}: the saved model has {count_params(model)} params"
            assert flop_counts(model)[0] == e["flops"], f"{where}: the saved model costs {flop_counts(model)[0]} FLOPs"
            if budget.latency is None and record.get("kept_heads") is not None:
                subnet = scores.subnet(budget, cost)[0]
                assert record["kept_heads"] == [h.tolist() for h in subnet.heads], f"{where}: other heads kept"


def _counts(heads: list[int], widths: list[int]) -> Subnet:
    return Subnet.from_counts(heads, widths)


def _check_budget(budget: Budget, e: dict, cost: CostModel, multiple: int, where: str) -> None:
    heads, widths = e["heads"], e["mlp_hidden"]
    if not budget.is_cost:  # a ratio pair: exactly the heads it asks, the neurons give or take the recorded rounding
        head_ratio, mlp_ratio = budget.head_ratio or 0.0, budget.mlp_ratio or 0.0
        total_heads, total_neurons = sum(cost.num_heads), sum(cost.num_neurons)
        assert sum(heads) == total_heads - removed_count(head_ratio, total_heads), f"{where}: heads for {head_ratio}"
        extra = (e.get("rounding") or {}).get("extra_neurons", 0)
        assert sum(widths) == total_neurons - removed_count(mlp_ratio, total_neurons) + extra, \
            f"{where}: neurons for {mlp_ratio} (rounding {e.get('rounding')})"
        return
    if budget.latency is not None:
        assert e["predicted_latency_ms"] <= budget.latency, f"{where}: predicts {e['predicted_latency_ms']} ms"
        return
    metric, _ = budget.cost_point(cost)
    dense = cost.dense_params if metric == "params" else cost.dense_flops
    value = 1.0 - budget.sparsity if budget.sparsity is not None else getattr(budget, metric)
    target = value * dense if value <= 1.0 else value  # as elastic.budget.resolve computes it
    assert e[metric] <= target, f"{where}: {metric} {e[metric]} exceeds the target {target}"
    if e[metric] < dense:  # anything cut: within one step (a head, `multiple` neurons) of the target (issue 48: a
        # split recorded for a deeper budget removed heads from a budget that asked for less, sparsity 0 included)
        per_head = cost.head_params if metric == "params" else cost.head_flops
        per_neuron = cost.neuron_params if metric == "params" else cost.neuron_flops
        step = max(per_head) + multiple * max(per_neuron) + 1
        assert target - e[metric] < step, f"{where}: {metric} {e[metric]} is {target - e[metric]:.0f} below the " \
                                          f"target {target:.0f}, more than one step ({step:.0f})"


# -- the tests --------------------------------------------------------------------------------------------------------
#: Valid commands that break an invariant today, kept out of the draws (so that CI tests the rest) and pinned below by
#: a strict xfail each: when one is fixed its test passes, fails as XPASS, and the draws can take it back.
KNOWN_BUGS: dict[str, dict] = {}


#: What these draws found and the fixes hold (each pinned below, and drawn again above).
FOUND = {
    # Lightning's seed_everything(None) warned "No seed found, seed set to 0" on stderr (and seeded 0, not a random
    # seed as the option's help says): a refused run printed two lines.
    "seed_true": {"seed_everything": True, "export.budgets": [{"params": 0.15}]},
    # a latency budget was refused after config.yaml, resume_state.pt and latency_table.json were written, and the run
    # removed its --out_dir only when it had created it: an existing (empty) one kept the three files.
    "latency_leftovers": {"export.budgets": [{"latency": 0.001}], "export.latency_batch_size": 1},
    # SNIPMagnitude multiplied the mean gradient by the number of batches summed over the ranks: 48 images in batches
    # of 16 are 3 batches on one process, 2 + 2 on two, so the scores grew by 4/3 (and alpha * w^2 weighed less).
    "snip_ddp": {"importance.scorer": "snapvit_pl.scoring.SNIPMagnitude"},
}


def test_seed_everything_true_refused_in_one_line(tmp_path):
    draw = Draw(FOUND["seed_true"], budgets=FOUND["seed_true"]["export.budgets"])
    result, command = _prune(draw, tmp_path / "run")
    assert result.returncode == 2, _failure(command, result, "expected the budget's refusal")
    check_run(draw, tmp_path / "run", result, command)


def test_snip_magnitude_scores_do_not_depend_on_the_sharding():
    """What ``prune.py --trainer.devices 2`` does, in process: each rank batches its own (interleaved) share of the
    images, then their sums are all-reduced."""
    from snapvit_pl.scoring import SNIPMagnitude

    cost = dense_cost()  # (builds the tiny model once)
    model = load_backbone(BackboneSpec.from_dict(_TINY_SPEC))
    images = torch.randn(48, 4, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    one = SNIPMagnitude().bind(model)
    for batch in images.split(16):  # 3 batches
        one.update(batch)
    one.reduce(lambda t: t)
    ranks = [SNIPMagnitude().bind(model), SNIPMagnitude().bind(model)]
    for rank, shard in zip(ranks, (images[0::2], images[1::2])):
        for batch in shard.split(16):  # 16 + 8 on each rank: 4 batches in all
            rank.update(batch)
    sent: list[torch.Tensor] = []
    ranks[1].reduce(lambda t: sent.append(t.clone()) or t)
    ranks[0].reduce(lambda t: t + sent.pop(0))
    a, b = one.compute(), ranks[0].compute()
    assert len(a.heads) == len(cost.num_heads)
    for x, y in zip(a.heads + a.neurons, b.heads + b.neurons):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=0)


def test_a_refused_latency_budget_leaves_an_existing_out_dir_empty(tmp_path):
    draw = Draw(FOUND["latency_leftovers"], out_dir_exists=True, budgets=FOUND["latency_leftovers"]["export.budgets"])
    (tmp_path / "run").mkdir()
    result, command = _prune(draw, tmp_path / "run")
    assert result.returncode == 2, _failure(command, result, "expected the budget's refusal")
    check_run(draw, tmp_path / "run", result, command)


@SETTINGS
@given(draw=commands())
def test_valid_command_lines_keep_the_invariants(draw: Draw):
    with tempfile.TemporaryDirectory(prefix="snapvit-valid-") as tmp:
        out_dir = Path(tmp) / ("run-\u00e9t\u00e9" if draw.c_locale else "run")
        if draw.out_dir_exists:
            out_dir.mkdir()
        result, command = _prune(draw, out_dir)
        report = check_run(draw, out_dir, result, command)
        event("finished" if report is not None else "refused (exit 2, one error line)")
        for how in ("closed_stdout", "via_config", "c_locale"):
            if getattr(draw, how):
                event(f"run with {how}")


@DDP_SETTINGS
@given(draw=commands(ddp=True))
def test_one_and_two_processes_write_the_same_files(draw: Draw):
    with tempfile.TemporaryDirectory(prefix="snapvit-ddp-") as tmp:
        runs = {}
        for devices in (1, 2):
            out_dir = Path(tmp) / f"devices{devices}"
            result, command = _prune(draw, out_dir, **{"trainer.devices": devices})
            runs[devices] = (out_dir, result, command, check_run(draw, out_dir, result, command))
        (one, r1, _, report1), (two, r2, c2, report2) = runs[1], runs[2]
        assert r1.returncode == r2.returncode, _failure(c2, r2, f"one process exited {r1.returncode}")
        if report1 is None:
            assert r1.stderr.strip() == r2.stderr.strip(), f"{c2}\none process: {r1.stderr}\ntwo: {r2.stderr}"
            return
        a, b = digests(one), digests(two)
        assert a.keys() == b.keys(), f"{c2}\nfiles differ: {sorted(a)} against {sorted(b)}"
        different = sorted(name for name in a if a[name] != b[name])
        scores_file = report1["scores_file"]
        assert different in ([], [scores_file]), f"{c2}\none and two processes wrote different {different}"
        event(f"scores file byte-identical on two processes: {not different}")
        if different:  # "the same scores as one process, up to float rounding" (scoring/gradient.py): the sums' order
            _same_scores(one / scores_file, two / scores_file, c2)
        assert [_stable(e) for e in report1["pruned"]] == [_stable(e) for e in report2["pruned"]], c2


def _stable(entry: dict) -> dict:
    """A report entry without what depends on the machine and the moment (as a saved model's record keeps it)."""
    entry = {k: v for k, v in entry.items() if k not in ("latency_ms", "predicted_latency_ms")}
    if "metrics" in entry:
        entry["metrics"] = {k: v for k, v in entry["metrics"].items() if k not in MEASURED_KEYS}
    if "correction" in entry:
        entry["correction"] = {k: v for k, v in entry["correction"].items() if k != "seconds"}
    return entry


def _same_scores(one: Path, two: Path, command: str) -> None:
    """The same elastic scores but for float rounding: every field equal, every tensor within 1e-6 relative."""
    a, b = ElasticScores.load(one), ElasticScores.load(two)
    for name in ("base", "fingerprint", "min_mlp_keep", "min_head_keep", "settings", "search"):
        assert getattr(a, name) == getattr(b, name), f"{command}\nthe scores' {name} differ"
    assert a.splits.to_dict() == b.splits.to_dict(), f"{command}\nthe recorded splits differ"
    pairs = list(zip(a.head_scores + a.neuron_scores, b.head_scores + b.neuron_scores))
    if a.coefficients is not None or b.coefficients is not None:
        pairs.append((a.coefficients, b.coefficients))
    for x, y in pairs:
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-6 * float(x.abs().max()), msg=lambda m: f"{command}\n{m}")
