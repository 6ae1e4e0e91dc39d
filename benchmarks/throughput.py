"""Measured CPU speedup of pruned models against their FLOPs reduction (issue goal: >= 0.9x). Not run in CI.

    python benchmarks/throughput.py [--run runs/prune/<timestamp>] [--threads 1,2] [--rounds 7]

Without ``--run`` it first runs ``python prune.py`` (the demo config: the default score on the reference model) with
the paper's six (mlp, head) pairs as budgets, in a temporary folder, and times those models.

CPU timings on a shared machine drift by 10-20% within minutes, which is larger than the effect
measured. So the dense model and every pruned model of the run are timed in alternating rounds
(each round times every model once, in a rotated order), the speedup is taken per round against
that round's dense time, and the median over rounds is reported.
Writes ``benchmarks/results/throughput.{md,json}``.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from snapvit_pl.eval import measure_throughput  # noqa: E402
from benchmarks.common import parse_args, write_results  # noqa: E402
from snapvit_pl.models import count_flops, input_shape, load_pruned  # noqa: E402


def paper_pairs_run(folder: Path) -> Path:
    """``python prune.py`` (the demo config) cutting the paper's six pairs into ``folder``, no evaluation."""
    from snapvit_pl.elastic import PAPER_PAIRS

    budgets = "[" + ", ".join(f"{{mlp_ratio: {m}, head_ratio: {h}}}" for m, h in PAPER_PAIRS) + "]"
    subprocess.run([sys.executable, str(ROOT / "prune.py"), "--out_dir", str(folder), f"--export.budgets={budgets}",
                    "--evaluation.metrics=[]", "--report.plots=false", "--report.print_table=false", "--progress=off"],
                   cwd=ROOT, check=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=None, help="a prune.py run directory (its models/ are timed; default: the "
                        "paper's six pairs cut by prune.py's demo config, made first)")
    parser.add_argument("--dense", default=str(ROOT / "assets" / "reference_vit_fmnist"), help="the dense checkpoint")
    parser.add_argument("--threads", default="1,2", help="torch thread counts to measure")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=10, help="timed forwards per model and round (median)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "throughput"))
    args = parse_args(parser)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.run) if args.run else paper_pairs_run(Path(tmp) / "run")
        measure(args, run)


def measure(args: argparse.Namespace, run: Path) -> None:
    """Time the dense model and ``run``'s pruned models; write the results."""
    model_dirs = sorted(p for p in (run / "models").iterdir() if (p / "architecture.json").is_file())
    if not model_dirs:
        raise SystemExit(f"error: {run}/models has no pruned checkpoints; give a prune.py run directory")
    models = {"dense": load_pruned(args.dense)[0].eval(), **{p.name: load_pruned(p)[0].eval() for p in model_dirs}}
    flops = {name: count_flops(m) for name, m in models.items()}
    shape = input_shape(models["dense"])
    started = time.perf_counter()
    results: dict[str, dict] = {}
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        names = list(models)
        per_round: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                measured = measure_throughput(models[name], shape, args.batch_size, warmup=2, repeats=args.repeats, device="cpu")
                per_round[name].append(measured.images_per_second)
        results[str(threads)] = {}
        for name in names:
            speedups = [a / d for a, d in zip(per_round[name], per_round["dense"])]
            results[str(threads)][name] = {
                "flops_reduction": flops["dense"] / flops[name], "images_per_s": statistics.median(per_round[name]),
                "speedup": statistics.median(speedups), "speedup_min": min(speedups), "speedup_max": max(speedups)}
        print(f"{threads} thread(s): " + ", ".join(f"{n} {v['speedup']:.2f}x/{v['flops_reduction']:.2f}x"
                                                  for n, v in results[str(threads)].items()), flush=True)
    report = {"benchmark": "benchmarks/throughput.py", "run": args.run or "the paper's six pairs (made first)", "batch_size": args.batch_size, "rounds": args.rounds,
              "repeats": args.repeats, "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M"), "total_s": round(time.perf_counter() - started, 1), "threads": results}
    # the range the docs quote: speedup / FLOPs reduction over the pruned models, per thread count
    report["efficiency"] = {}
    for threads, rows in results.items():
        efficiency = [v["speedup"] / v["flops_reduction"] for n, v in rows.items() if n != "dense"]
        report["efficiency"][threads] = {"min": min(efficiency), "max": max(efficiency)}
    lines = ["# Measured CPU speedup vs FLOPs reduction", "",
             f"`python benchmarks/throughput.py{f' --run {args.run}' if args.run else ''}`, {report['date']}, {report['cpu']}, batch {args.batch_size}, "
             f"{args.rounds} alternating rounds x {args.repeats} timed forwards per model ({report['total_s']:.0f} s). Speedup = "
             "median over rounds of (pruned images/s) / (dense images/s in the same round); min-max over rounds in brackets; "
             "efficiency = speedup / FLOPs reduction (goal >= 0.90): "
             + "; ".join(f"{e['min']:.2f}-{e['max']:.2f} with {t} thread(s)" for t, e in report["efficiency"].items())
             + " over the pruned models.", ""]
    for threads, rows in results.items():
        lines += [f"## {threads} torch thread(s)", "", "| model | FLOPs reduction | images/s | speedup | efficiency |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {name} | {v['flops_reduction']:.2f}x | {v['images_per_s']:.0f} | {v['speedup']:.2f}x "
                  f"({v['speedup_min']:.2f}-{v['speedup_max']:.2f}) | {v['speedup'] / v['flops_reduction']:.2f} |"
                  for name, v in rows.items()]
        lines.append("")
    write_results(Path(args.out), report, "\n".join(lines), args, round_values=False, subprocesses=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
