"""What the project computes, on a fixed suite of small pruning runs: the record that lets a pure speed-up keep the
accuracy and order results measured before it (``benchmarks/provenance.py``).

    python benchmarks/behaviour.py     # benchmarks/results/behaviour/<state>.json: this checkout's behaviour record

A results file records the project files its run used (``benchmarks.common.used_files``); one of them changing makes
it stale. A change that makes the project faster without changing what it computes should not: a results file that
measures behaviour only (accuracies, orders, chosen splits: :data:`benchmarks.provenance.BEHAVIOUR`, never a timing)
stays current when a behaviour record made with the files its run used and one made with today's files hold the
same numbers (:func:`same_behaviour`) and cover every file that changed.

The suite: ``prune.py`` on the reference development model and Fashion-MNIST (the demo config shrunk to seconds),
once per variant of :data:`SUITE` (every scorer family, the coefficient search, every correction method, the split
race with its grid, MLP rounding, every budget kind), each run's numbers kept: the local and elastic scores, the
coefficients, the chosen splits, each model's kept units, its accuracies and a checksum of its weights, the search's
fitness. Timings, memory and throughput are left out. The grid points' races (the splits recorded for budgets cut
later) can be set aside (:func:`without_grid`): a results file whose runs race no grid point does not rest on them.
Runs are seeded and on one thread: the same checkout gives the same numbers (tested), and the comparison allows float
noise (:data:`RTOL`).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, Progress, parse_args, provenance  # noqa: E402

#: Where behaviour records go, one file per state of the code (the digest of the files the suite used).
RECORDS = RESULTS / "behaviour"
#: Relative tolerance of two records' numbers (float noise, not a change of behaviour).
RTOL = 1e-4
#: Absolute tolerance (numbers near zero).
ATOL = 1e-7
#: The demo config shrunk to seconds (the reference model, Fashion-MNIST: the data pipeline and model loading too).
SHRINK = ["--data.init_args.max_samples=64", "--data.init_args.batch_size=16", "--search.num_images=32",
          "--search.batch_size=16", "--search.pca_components=8", "--evaluation.metrics=[knn, linear, head]",
          "--evaluation.train_samples=100", "--evaluation.val_samples=60", "--evaluation.knn_k=5",
          "--export.split_images=16", "--export.split_grid=0.25", "--report.print_table=false",
          "--report.plots=false", "--progress=off",
          "--export.budgets=[{sparsity: 0.3}, {flops: 0.5}, {params: 0.35}, {mlp_ratio: 0.35, head_ratio: 0.2}]"]
#: name -> prune.py options on top of :data:`SHRINK`.
SUITE: dict[str, list[str]] = {
    "default": [],
    "greedy_stages_block": ["--importance.scorer.init_args.stages=2", "--importance.scorer.init_args.gram=block"],
    "greedy_lowrank": ["--importance.scorer.init_args.gram=lowrank", "--importance.scorer.init_args.rank=16"],
    "sensitivity_mlp8": ["--importance.scorer=snapvit_pl.scoring.OutputSensitivity", "--export.mlp_multiple=8"],
    "ssl_fisher_xnes": ["--importance.scorer=snapvit_pl.scoring.SSLFisher", "--search.optimizer=xnes",
                        "--search.max_evaluations=6", "--search.popsize=3", "--data.init_args.n_local_views=2"],
    "label_fisher_snes": ["--importance.scorer=snapvit_pl.scoring.LabelFisher", "--search.max_evaluations=6",
                          "--search.popsize=3"],
    "magnitude_sparsegpt": ["--importance.scorer=snapvit_pl.scoring.Magnitude", "--correction.enabled=true",
                            "--correction.method=sparsegpt", "--correction.num_samples=32"],
    "lamp_dense_fit": ["--importance.scorer=snapvit_pl.scoring.LAMP", "--correction.enabled=true",
                       "--correction.method=dense_fit", "--correction.num_samples=32",
                       "--correction.reconstruct_steps=4", "--correction.batch_size=16"],
    "taylor_bias": ["--importance.scorer=snapvit_pl.scoring.Taylor", "--correction.enabled=true",
                    "--correction.method=bias", "--correction.num_samples=32"],
    "activation_schedule": ["--importance.scorer=snapvit_pl.scoring.Activation", "--export.split=schedule"],
}


def _tensor_numbers(tensor: torch.Tensor) -> list[float]:
    return [float(v) for v in tensor.detach().double().flatten().tolist()]


def run_numbers(run: Path) -> dict[str, Any]:
    """The numbers of one finished run: what it computed, no timing."""
    from safetensors import safe_open

    report = json.loads((run / "report.json").read_text())
    numbers: dict[str, Any] = {}
    with safe_open(str(run / "elastic_scores.safetensors"), "pt") as scores:
        for key in sorted(scores.keys()):
            numbers[f"scores.{key}"] = _tensor_numbers(scores.get_tensor(key))
    kept = ("params", "flops", "mlp_ratio", "head_ratio", "requested_mlp_ratio", "requested_head_ratio", "heads",
            "mlp_hidden")
    for entry in [report["dense"], *report["pruned"]]:
        name = entry.get("label", "dense")
        for key in kept:
            if entry.get(key) is not None:
                numbers[f"{name}.{key}"] = entry[key]
        for metric, value in sorted((entry.get("metrics") or {}).items()):
            if metric.endswith(("_top1", "_top5", "_miou")):
                numbers[f"{name}.{metric}"] = value
        checkpoint = entry.get("checkpoint")
        if checkpoint:
            from safetensors.torch import load_file

            weights = load_file(str(run / checkpoint / "model.safetensors"))
            numbers[f"{name}.weights"] = [float(sum(t.double().sum() for t in weights.values())),
                                          float(sum(t.double().abs().sum() for t in weights.values()))]
    for choice in report.get("splits") or []:
        numbers[f"split.{choice['label']}"] = [choice["head_ratio"], *[d for _, _, d in choice["candidates"]]]
    search = report.get("search") or {}
    for key in ("initial_fitness", "best_fitness"):
        if search.get(key) is not None:
            numbers[f"search.{key}"] = search[key]
    return numbers


def suite(names: list[str], log: Progress) -> dict[str, dict[str, Any]]:
    """Each variant's numbers (:func:`run_numbers`), one thread, seeded."""
    from snapvit_pl.cli import prune_main

    torch.set_num_threads(1)
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            run = Path(tmp) / name
            code = prune_main(["--out_dir", str(run), *SHRINK, "--seed_everything=0", *SUITE[name]])
            if code != 0:
                raise SystemExit(f"error: the behaviour run {name} exited with {code}")
            out[name] = run_numbers(run)
            log(f"{name}: {len(out[name])} numbers")
    return out


def state_of(files: dict[str, str]) -> str:
    """The name of a state of the code: a digest of the files a record used, with theirs."""
    return hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:16]


def grid_entries(run: dict[str, Any]) -> set[str]:
    """The keys of one run's numbers that record a grid point's race (a split recorded for budgets cut later, from
    which the run made no model): ``split.<label>`` where the run has no model ``<label>`` (every model's
    ``<label>.params`` is recorded)."""
    return {key for key in run if key.startswith("split.") and f"{key.removeprefix('split.')}.params" not in run}


def without_grid(numbers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A record's numbers without the grid's races (:func:`grid_entries`): what a run that races no grid point
    (``export.split_grid`` 0) rests on."""
    return {name: {k: v for k, v in run.items() if k not in grid_entries(run)} for name, run in numbers.items()}


def same_behaviour(first: Any, second: Any, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """Whether two records' numbers agree: the same keys and lengths, integers equal, floats within tolerance."""
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(same_behaviour(first[k], second[k], rtol, atol) for k in first)
    if isinstance(first, list) and isinstance(second, list):
        return len(first) == len(second) and all(same_behaviour(a, b, rtol, atol) for a, b in zip(first, second))
    if isinstance(first, bool) or isinstance(second, bool) or isinstance(first, str) or isinstance(second, str):
        return first == second
    if isinstance(first, int) and isinstance(second, int):
        return first == second
    if isinstance(first, (int, float)) and isinstance(second, (int, float)):
        return abs(first - second) <= atol + rtol * max(abs(first), abs(second))
    return first == second


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(SUITE), help="the suite's runs (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="the record (default: behaviour/<state>.json)")
    args = parse_args(parser, argv)
    names = [n for n in args.variants.split(",") if n]
    unknown = sorted(set(names) - set(SUITE))
    if unknown:
        raise SystemExit(f"error: unknown variants {unknown}; choose among {', '.join(SUITE)}")
    log = Progress()
    numbers = suite(names, log)
    record = {"suite": names, "numbers": numbers, "provenance": provenance(args)}
    path = args.out or RECORDS / f"{state_of(record['provenance']['files'])}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    from snapvit_pl.io import write_json_atomic

    write_json_atomic(path, record)
    print(f"wrote {path} ({sum(len(v) for v in numbers.values())} numbers from {len(names)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
