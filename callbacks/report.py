"""Report: ``report.json`` + ``report.md`` in the run directory and a summary table on the console."""
from __future__ import annotations

import time
from typing import Any

import pytorch_lightning as pl
from rich.console import Console
from rich.table import Table

from snapvit_pl.io import write_json_atomic, write_text_atomic
from snapvit_pl.lightning.pruning_module import PruningModule


class ReportCallback(pl.Callback):
    """Collects what the other stages measured and writes the run's report (rank 0 only).

    Args:
        print_table: print the summary table at the end of the run.
    """

    def __init__(self, print_table: bool = True):
        self.print_table = print_table
        self._started = time.perf_counter()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        self._started = time.perf_counter()

    def teardown(self, trainer: pl.Trainer, pl_module: PruningModule, stage: str) -> None:
        if stage != "fit" or not trainer.is_global_zero or not pl_module.extracted and "dense" not in pl_module.summary:
            return
        pl_module.summary["timings"]["total_s"] = time.perf_counter() - self._started
        report = build_report(pl_module)
        write_json_atomic(pl_module.run_dir / "report.json", report)
        write_text_atomic(pl_module.run_dir / "report.md", report_markdown(report))
        if self.print_table:
            Console().print(summary_table(report))
            Console().print(f"Run directory: [bold]{pl_module.run_dir}[/bold]")


def build_report(pl_module: PruningModule) -> dict[str, Any]:
    """The ``report.json`` content."""
    summary = pl_module.summary
    search = summary.get("search", {})
    return {
        "model": pl_module.spec.to_dict() | {"fingerprint": pl_module.base_fingerprint},
        "method": (pl_module.local_scores.settings if pl_module.local_scores else {}) | {"search": search.get("settings")},
        "timings": {k: round(v, 3) for k, v in summary["timings"].items()},
        "search": {k: v for k, v in search.items() if k != "settings"},
        "scores_file": summary.get("scores_file"),
        "dense": summary.get("dense", {}),
        "pruned": [
            {"label": e.label, "budget": e.budget, "mlp_ratio": round(e.mlp_ratio, 6), "head_ratio": round(e.head_ratio, 6),
             "heads": e.subnet.head_counts, "mlp_hidden": e.subnet.neuron_counts, **e.info}
            for e in pl_module.extracted
        ],
    }


def _metric_names(report: dict[str, Any]) -> list[str]:
    names = list(report["dense"].get("metrics", {}))
    for entry in report["pruned"]:
        names += [k for k in entry.get("metrics", {}) if k not in names]
    return names


def _rows(report: dict[str, Any]) -> list[list[str]]:
    dense = report["dense"]
    metrics = _metric_names(report)
    rows = []
    for name, entry, ratios in [("dense", dense, "-")] + [
        (e["label"], e, f"{e['mlp_ratio']:.2f} / {e['head_ratio']:.2f}") for e in report["pruned"]
    ]:
        rows.append([
            name, ratios, f"{entry['params'] / 1e6:.3f}M ({entry['params'] / dense['params']:.0%})",
            f"{entry['flops'] / 1e9:.4f}G ({entry['flops'] / dense['flops']:.0%})",
            *[_format(m, entry.get("metrics", {}).get(m)) for m in metrics],
        ])
    return rows


def _format(metric: str, value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if not metric.endswith(("top1", "top5", "miou")) else f"{100 * value:.2f}"


def _columns(report: dict[str, Any]) -> list[str]:
    names = _metric_names(report)
    return ["model", "MLP / head ratio", "params", "FLOPs"] + [f"{m} (%)" if m.endswith(("top1", "top5", "miou")) else m for m in names]


def summary_table(report: dict[str, Any]) -> Table:
    """A rich table: one row for the dense model and one per pruned model."""
    table = Table(title=f"snapvit-pl: {report['model']['model_name']}")
    for column in _columns(report):
        table.add_column(column, justify="left" if column == "model" else "right")
    for row in _rows(report):
        table.add_row(*row)
    return table


def report_markdown(report: dict[str, Any]) -> str:
    """``report.md``: settings, timings and the summary table."""
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in report["timings"].items())
    search = report["search"]
    lines = [
        f"# Pruning report: {report['model']['model_name']}", "",
        f"- scorer: `{report['method'].get('scorer', {}).get('name', '?')}`",
        f"- search: {search.get('evaluations', 0)} evaluations, best fitness {search.get('best_fitness')}",
        f"- timings: {timings}", f"- elastic scores: `{report['scores_file']}`", "",
        "| " + " | ".join(_columns(report)) + " |", "|" + "---|" * len(_columns(report)),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(report)]
    return "\n".join(lines) + "\n"
