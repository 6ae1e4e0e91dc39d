"""What the project computes, guarded: a fixed suite of small seeded pruning runs against one committed baseline.

    python benchmarks/regression.py            # run the suite, compare with the baseline (exit 1 on a difference)
    python benchmarks/regression.py --update   # a deliberate change of behaviour: write the new baseline

The suite: ``prune.py`` on the reference development model and Fashion-MNIST (the demo config shrunk to seconds),
once per variant of :data:`SUITE` (every scorer family, both searches, every correction method, the split race with
its grid, MLP rounding, every budget kind), seeded, on one thread. Each run keeps what it computed, never how long it
took (:func:`run_numbers`): a summary of the local and elastic scores (sum, norm, extremes of each tensor), the
chosen splits with their drifts, each model's kept units, size, accuracies and a checksum of its weights, the
search's fitness. The baseline (:data:`BASELINE`, a few kilobytes) holds those numbers and the digests of the
project files the suite used; ``tests/benchmarks/test_regression.py`` runs the suite in CI.

When the numbers move, the check names the quoted accuracy results files whose runs used a file that changed since
the baseline (:func:`resting_on`) and the one command that measures them again (``benchmarks/remeasure.py``). A
change meant to compute the same (a refactor, a speed-up, a comment) passes untouched; a deliberate change of
behaviour writes the baseline again (``--update``) and measures those files again, in the same change.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import Progress, display, file_digest, parse_args, used_files  # noqa: E402

#: The committed baseline: the suite's numbers and the files it used (digests).
BASELINE = ROOT / "tests" / "benchmarks" / "regression_baseline.json"
#: Relative tolerance of two runs' numbers (float noise, not a change of behaviour).
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


def summary(tensor: torch.Tensor) -> list[float]:
    """A score tensor in four numbers: sum, Euclidean norm, minimum and maximum (any changed score moves one)."""
    values = tensor.detach().double().flatten()
    return [float(values.sum()), float(values.norm()), float(values.min()), float(values.max())]


def run_numbers(run: Path) -> dict[str, Any]:
    """The numbers of one finished ``prune.py`` run: what it computed, no timing."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    report = json.loads((run / "report.json").read_text())
    numbers: dict[str, Any] = {}
    with safe_open(str(run / "elastic_scores.safetensors"), "pt") as scores:
        for key in sorted(scores.keys()):
            numbers[f"scores.{key}"] = summary(scores.get_tensor(key))
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
        if entry.get("checkpoint"):
            weights = load_file(str(run / entry["checkpoint"] / "model.safetensors"))
            numbers[f"{name}.weights"] = [float(sum(t.double().sum() for t in weights.values())),
                                          float(sum(t.double().abs().sum() for t in weights.values()))]
    for choice in report.get("splits") or []:
        numbers[f"split.{choice['label']}"] = [choice["head_ratio"], *[d for _, _, d in choice["candidates"]]]
    search = report.get("search") or {}
    for key in ("initial_fitness", "best_fitness"):
        if search.get(key) is not None:
            numbers[f"search.{key}"] = search[key]
    return numbers


def suite(names: list[str], log: Optional[Progress] = None) -> dict[str, dict[str, Any]]:
    """Each variant's numbers (:func:`run_numbers`), one thread, seeded."""
    from snapvit_pl.cli import prune_main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out: dict[str, dict[str, Any]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                run = Path(tmp) / name
                code = prune_main(["--out_dir", str(run), *SHRINK, "--seed_everything=0", *SUITE[name]])
                if code != 0:
                    raise RuntimeError(f"the regression run {name} exited with {code}")
                out[name] = run_numbers(run)
                if log is not None:
                    log(f"{name}: {len(out[name])} numbers")
    finally:
        torch.set_num_threads(threads)
    return out


def close(first: Any, second: Any, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """Whether two numbers (or lists) agree: integers and strings equal, floats within tolerance."""
    if isinstance(first, list) and isinstance(second, list):
        return len(first) == len(second) and all(close(a, b, rtol, atol) for a, b in zip(first, second))
    if isinstance(first, (bool, str)) or isinstance(second, (bool, str)):
        return first == second
    if isinstance(first, int) and isinstance(second, int):
        return first == second
    if isinstance(first, (int, float)) and isinstance(second, (int, float)):
        return abs(first - second) <= atol + rtol * max(abs(first), abs(second))
    return first == second


def differences(expected: dict[str, dict[str, Any]], actual: dict[str, dict[str, Any]]) -> list[str]:
    """Every number that differs between two suites' results, as ``variant: key expected -> actual``."""
    found = []
    for name in sorted(set(expected) | set(actual)):
        if name not in actual or name not in expected:
            found.append(f"{name}: {'not run' if name not in actual else 'not in the baseline'}")
            continue
        for key in sorted(set(expected[name]) | set(actual[name])):
            old, new = expected[name].get(key, "absent"), actual[name].get(key, "absent")
            if not close(old, new):
                found.append(f"{name}: {key} {_short(old)} -> {_short(new)}")
    return found


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_baseline(path: Path = BASELINE) -> dict[str, Any]:
    return json.loads(path.read_text())


def baseline_id(path: Path = BASELINE) -> Optional[str]:
    """The baseline a run was made under (a digest of its numbers; None when there is none): every results file
    records it, and a merge of results refuses runs made under different ones."""
    if not path.is_file():
        return None
    numbers = json.loads(path.read_text())["numbers"]
    return hashlib.sha256(json.dumps(numbers, sort_keys=True).encode()).hexdigest()[:12]


def changed_since(baseline: dict[str, Any], root: Path = ROOT) -> list[str]:
    """The files the baseline's suite used that are no longer what it read (removed ones included)."""
    return sorted(name for name, digest in baseline["files"].items() if file_digest(root / name) != digest)


def resting_on(changed: list[str]) -> list[Path]:
    """The quoted results files that hold numbers the project computes (kind ``accuracy``) whose runs used one of
    the ``changed`` files (all of them when a run did not record its files, or when nothing recorded changed: a
    dependency's release, say). Records of past decisions (``research/``) are not measured again: they are quoted
    with the commit they measured."""
    from benchmarks.provenance import RECORDS, kinds_of, quoted_files, records, results_files, with_inputs

    quoted = quoted_files()
    candidates = [p for p in results_files() if p in quoted and "accuracy" in kinds_of(p)
                  and not str(p.relative_to(ROOT)).startswith(RECORDS)]
    found = []
    for path in candidates:  # (a merged file rests on what its input runs used)
        used = [r.get("files") if r else None for run in with_inputs([path]) for r in records(run)]
        if not changed or any(files is None or set(files) & set(changed) for files in used):
            found.append(path)
    return found


def remeasure_command(paths: list[Path]) -> str:
    """The one command that measures ``paths`` again (``benchmarks/remeasure.py``)."""
    return shlex.join(["python", "benchmarks/remeasure.py", *[str(p.relative_to(ROOT)) for p in paths]])


def failure_message(found: list[str], changed: list[str], resting: list[Path]) -> str:
    """What a failed check says: what moved, which files changed, what to measure again and how."""
    shown = found[:12] + ([f"... and {len(found) - 12} more"] if len(found) > 12 else [])
    lines = ["the project computes other numbers than the regression baseline (tests/benchmarks/"
             "regression_baseline.json):", *[f"  {line}" for line in shown],
             "files changed since the baseline: " + (", ".join(changed) if changed else "none (a dependency?)")]
    if resting:
        lines += ["quoted results that rest on them: " + ", ".join(str(p.relative_to(ROOT)) for p in resting),
                  "if the change is meant, in the same change: python benchmarks/regression.py --update && "
                  + remeasure_command(resting)]
    else:
        lines.append("no quoted results rest on them; if the change is meant: python benchmarks/regression.py --update")
    return "\n".join(lines)


def check(numbers: dict[str, dict[str, Any]], baseline: Optional[dict[str, Any]] = None) -> Optional[str]:
    """None when ``numbers`` agree with the baseline, else the :func:`failure_message`."""
    baseline = load_baseline() if baseline is None else baseline
    found = differences(baseline["numbers"], numbers)
    if not found:
        return None
    changed = changed_since(baseline)
    return failure_message(found, changed, resting_on(changed))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="write the baseline from this checkout (a deliberate "
                        "change of behaviour; then measure again what the check names)")
    parser.add_argument("--out", type=Path, default=BASELINE, help="the baseline file (default: %(default)s)")
    args = parse_args(parser, argv)
    log = Progress()
    numbers = suite(list(SUITE), log)
    if args.update:
        from snapvit_pl.io import write_json_atomic

        files = {name: digest for name, digest in used_files().items() if not name.startswith("tests/")}
        write_json_atomic(args.out, {"suite": list(SUITE), "command": "python benchmarks/regression.py --update",
                                     "numbers": numbers, "files": files})
        print(f"wrote {display(args.out)} ({sum(len(v) for v in numbers.values())} numbers from {len(SUITE)} runs, "
              f"baseline {baseline_id(args.out)})")
        return 0
    message = check(numbers, load_baseline(args.out))
    print(message or f"the suite computes what the baseline records ({len(SUITE)} runs)")
    return 1 if message else 0


if __name__ == "__main__":
    sys.exit(main())
