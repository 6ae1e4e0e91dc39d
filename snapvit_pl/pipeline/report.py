"""Stage 4: the run's report (``report.json``, ``report.md``) and the console summary table."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..eval.suite import ACCURACY_KEYS, THROUGHPUT_KEY
from ..io import write_json_atomic, write_text_atomic
from .state import RunState

#: Metrics shown in the tables, in this order (every other result stays in report.json).
TABLE_METRICS = (*ACCURACY_KEYS, THROUGHPUT_KEY)


@dataclass
class ReportSettings:
    """Args:
        print_table: print the summary table at the end of the run."""

    print_table: bool = True


def build_report(state: RunState) -> dict[str, Any]:
    """The ``report.json`` content."""
    search = {} if state.search is None else (state.search.summary() | {"resumed_at": state.search.resumed_at})
    dense = {} if state.dense is None else {"params": state.dense.params, "flops": state.dense.flops}
    if state.dense is not None and state.dense.metrics is not None:
        dense["metrics"] = state.dense.metrics
    return {
        "model": state.spec.to_dict() | {"fingerprint": state.fingerprint},
        "method": {"scorer": state.scorer, "search": state.search_settings},
        "timings": state.timings.to_dict(),
        "search": search,
        "scores_file": state.scores_file,
        "dense": dense,
        "pruned": [item.record() for item in state.extracted],
    }


def write_report(state: RunState, run_dir: str | Path, print_table: bool = True) -> dict[str, Any]:
    """Write ``report.json`` and ``report.md`` into ``run_dir`` (and print the summary table); returns the report."""
    report = build_report(state)
    write_json_atomic(Path(run_dir) / "report.json", report)
    write_text_atomic(Path(run_dir) / "report.md", report_markdown(report))
    if print_table:
        from rich.console import Console

        console = Console()
        console.print(summary_table(report))
        console.print(f"Run directory: [bold]{run_dir}[/bold]")
    return report


def _metric_names(report: dict[str, Any]) -> list[str]:
    present = set(report["dense"].get("metrics") or {})
    for entry in report["pruned"]:
        present |= set(entry.get("metrics") or {})
    return [m for m in TABLE_METRICS if m in present]


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
            *[_format(m, (entry.get("metrics") or {}).get(m)) for m in metrics],
        ])
    return rows


def _format(metric: str, value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.2f}" if metric in ACCURACY_KEYS else f"{value:.1f}"


def _columns(report: dict[str, Any]) -> list[str]:
    names = _metric_names(report)
    return ["model", "MLP / head ratio", "params", "FLOPs"] + [f"{m} (%)" if m in ACCURACY_KEYS else m for m in names]


def summary_table(report: dict[str, Any]):
    """A rich table: one row for the dense model and one per pruned model."""
    from rich.table import Table

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
