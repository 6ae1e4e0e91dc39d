"""Latency budgets on the CPU: the table's predicted latency of each extracted model against its measured latency.

    python benchmarks/latency_budget.py --threads 1              # reference model, batch 1 and 64 (a few minutes)
    python benchmarks/latency_budget.py --quick                  # smoke run

For each batch size, the latency table is measured (:func:`snapvit_pl.elastic.latency.measure_latency_table`:
every head count and 8 MLP widths of each block shape, timed in interleaved rounds), six latency
budgets (the table's latency of the paper's six pairs, so reachable at any batch size) are cut from the elastic scores
(SSL-Fisher local scores of the default run with the initial coefficients, or ``--scores``), and the
dense and all pruned models are timed together in interleaved rounds (median per model). Writes
``benchmarks/results/latency_budget.{json,md}`` with ``max_relative_error`` per batch size.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    RESULTS, Progress, display, machine_info, model_overrides, parse_args, prune_setup, write_results,
)
from benchmarks.compare_methods import method_scores  # noqa: E402
from snapvit_pl.device import resolve_device  # noqa: E402
from snapvit_pl.elastic import PAPER_PAIRS, Budget, CostModel, ElasticScores  # noqa: E402
from snapvit_pl.elastic.latency import measure_latency_table, time_rounds  # noqa: E402
from snapvit_pl.models import eval_mode, input_shape  # noqa: E402
from snapvit_pl.pipeline import extract_models  # noqa: E402



def run(args: argparse.Namespace) -> dict[str, Any]:
    log = Progress()
    torch.set_num_threads(args.threads)
    overrides = ["--data.init_args.max_samples=64"] if args.quick else []
    setup = prune_setup(*model_overrides(args.model), *overrides)
    model, device = setup.model, resolve_device("cpu")
    if args.scores:
        scores = ElasticScores.load(args.scores)
        scores.check_model(model)
    else:
        scores, _ = method_scores("ours", setup, log, {})
    report: dict[str, Any] = {"benchmark": "benchmarks/latency_budget.py", "model": display(Path(args.model)),
                              "device": "cpu", "threads": args.threads, "batches": {}}
    for batch in args.batches:
        started = time.perf_counter()
        table = measure_latency_table(model, batch, device, repeats=args.repeats, warmup=args.warmup)
        log(f"batch {batch}: table measured in {time.perf_counter() - started:.0f}s (dense {table.dense_ms:.2f} ms)")
        cost = CostModel(model, latency=table)
        # the pairs' predicted latencies, each once (on a coarse or noisy table two pairs can predict the same one)
        latencies = dict.fromkeys(table.predict(scores.subnet(Budget(mlp_ratio=m, head_ratio=h))[0]) for m, h in PAPER_PAIRS)
        budgets = [Budget(latency=ms) for ms in latencies]
        items = extract_models(model, scores, budgets, cost=cost, keep_models=True)
        images = torch.randn(batch, *input_shape(model))
        models = [model] + [item.model for item in items]
        with torch.inference_mode(), eval_mode(*models):
            measured = time_rounds([lambda m=m: m(images) for m in models], args.warmup, args.rounds, device)
        rows = []
        for item, ms in zip(items, measured[1:]):
            predicted = table.predict(item.subnet)
            fraction = item.budget.latency / table.dense_ms
            rows.append({"budget_ms": item.budget.latency, "fraction_of_dense": fraction, "predicted_ms": predicted,
                         "measured_ms": ms, "relative_error": abs(predicted - ms) / ms, "heads": item.subnet.head_counts,
                         "mlp_hidden": item.subnet.neuron_counts, "mlp_ratio": item.mlp_ratio, "head_ratio": item.head_ratio,
                         "flops_fraction": item.flops / cost.dense_flops})
            log(f"  {fraction:.0%}: budget {item.budget.latency:.2f} ms, predicted {predicted:.2f}, measured {ms:.2f} "
                f"({100 * rows[-1]['relative_error']:.1f}% off)")
        report["batches"][str(batch)] = {"table_dense_ms": table.dense_ms, "measured_dense_ms": measured[0],
                                         "overhead_ms": table.overhead_ms, "rows": rows,
                                         "max_relative_error": max(r["relative_error"] for r in rows),
                                         "mean_relative_error": sum(r["relative_error"] for r in rows) / len(rows)}
    report["machine"] = machine_info()
    report["total_s"] = time.perf_counter() - log.start
    return report


def markdown(report: dict[str, Any]) -> str:
    lines = ["# Latency budgets: predicted against measured", "",
             f"`python benchmarks/latency_budget.py`, {report['machine']['date']}, CPU, {report['threads']} torch thread(s), "
             f"{report['total_s'] / 60:.1f} min. Model: {report['model']}. Budgets: the table's latency of the paper's six "
             "(mlp, head) pairs, each resolved on the latency table measured for that batch size (a latency target, "
             "not the pair); every model then timed in interleaved rounds (median).", ""]
    for batch, entry in report["batches"].items():
        lines += [f"## batch {batch}: max relative error {100 * entry['max_relative_error']:.1f}% "
                  f"(mean {100 * entry['mean_relative_error']:.1f}%)", "",
                  f"Dense: {entry['measured_dense_ms']:.2f} ms measured, {entry['table_dense_ms']:.2f} ms in the table.", "",
                  "| budget (of dense) | ms budget | predicted ms | measured ms | error | FLOPs kept | mlp / head ratio |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        lines += [f"| {100 * r['fraction_of_dense']:.0f}% | {r['budget_ms']:.2f} | {r['predicted_ms']:.2f} | "
                  f"{r['measured_ms']:.2f} | {100 * r['relative_error']:.1f}% | {100 * r['flops_fraction']:.0f}% | "
                  f"{r['mlp_ratio']:.2f} / {r['head_ratio']:.2f} |" for r in entry["rows"]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="reference", help="a development model of benchmarks/common.py")
    parser.add_argument("--scores", default=None, help="an elastic_scores.safetensors of this model")
    parser.add_argument("--batches", default="1,64", help="batch sizes")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 on a busy machine)")
    parser.add_argument("--rounds", type=int, default=30, help="timing rounds of the extracted models")
    parser.add_argument("--quick", action="store_true", help="smoke run: few rounds")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/latency_budget[_quick])")
    args = parse_args(parser, argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.repeats, args.warmup = (3, 1) if args.quick else (15, 3)
    if args.quick:
        args.rounds, args.batches = 3, [1, 8]
    report = run(args)
    prefix = Path(args.out) if args.out else RESULTS / ("latency_budget_quick" if args.quick else "latency_budget")
    write_results(prefix, report, markdown, args)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
