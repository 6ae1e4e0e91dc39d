"""Stage 4: the run's report (``report.json``, ``report.md``, ``plots/``) and the console summary table."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..eval.suite import THROUGHPUT_KEY
from ..io import write_json_atomic, write_text_atomic
from .state import RunState

#: Metrics shown in the tables and plots (short column label, full name); everything else stays in report.json.
TABLE_METRICS = {
    "knn_top1": ("k-NN", "weighted k-NN top-1"), "linear_top1": ("linear", "linear-probe top-1"),
    "head_top1": ("head", "own-head top-1"), "seg_miou": ("seg", "segmentation mIoU"),
    THROUGHPUT_KEY: ("img/s", "images per second"),
}


@dataclass
class ReportSettings:
    """What the report shows (report.json and report.md are always written).

    Args:
        print_table: print the summary table at the end of the run.
        plots: write the figures into ``plots/`` (and TensorBoard) and embed them in ``report.md``.
    """

    print_table: bool = True
    plots: bool = True


def build_report(state: RunState) -> dict[str, Any]:
    """The ``report.json`` content."""
    search = {} if state.search is None else (state.search.summary() | {"resumed_at": state.search.resumed_at,
                                                                        "history": state.search.history})
    dense = {} if state.dense is None else {"params": state.dense.params, "flops": state.dense.flops}
    if state.dense is not None and state.dense.metrics is not None:
        dense["metrics"] = state.dense.metrics
    return {
        "model": state.spec.to_dict() | {"fingerprint": state.fingerprint},
        "method": {"scorer": state.scorer,
                   "search": None if state.search_settings is None else state.search_settings.to_dict()},
        "timings": state.timings.to_dict(),
        "search": search,
        "splits": [asdict(choice) for choice in state.splits],
        "scores_file": state.scores_file,
        "skipped_files": state.skipped_files,
        "dense": dense,
        "pruned": [item.record() for item in state.extracted],
    }


def write_report(state: RunState, run_dir: str | Path, print_table: bool = True, plots: bool = True,
                 on_figure: Optional[Callable[[str, Any], None]] = None) -> dict[str, Any]:
    """Write ``report.json``, ``report.md`` and ``plots/*.png`` into ``run_dir`` (and print the summary table).

    Args:
        state: the finished run.
        run_dir: the run directory.
        print_table: print the summary table.
        plots: render the figures (``on_figure`` also receives each, e.g. for TensorBoard).
    """
    from .plots import write_plots

    run_dir = Path(run_dir)
    report = build_report(state)
    figures = write_plots(report, run_dir / "plots", on_figure) if plots else {}
    write_json_atomic(run_dir / "report.json", report)
    write_text_atomic(run_dir / "report.md", report_markdown(report, {k: f"plots/{p.name}" for k, p in figures.items()}))
    if print_table:
        from rich.console import Console

        console = Console()
        if not console.is_terminal:  # a pipe or a file: no width limit, so no folding at the default 80 columns
            console = Console(width=100)
        console.print(summary_table(report))
        console.print(f"Run directory: [bold]{run_dir}[/bold]")
    return report


def logged_metrics(report: dict[str, Any]) -> tuple[list[tuple[str, float, int]], dict[str, float]]:
    """What TensorBoard gets: ``(tag, value, step)`` scalars (each metric against the kept parameter count, so
    the chart is accuracy against size) and the hparams metrics (``dense/<metric>``, ``<label>/<metric>``)."""
    scalars, hparams = [], {}
    for name, entry in [("dense", report["dense"])] + [(e["label"], e) for e in report["pruned"]]:
        for metric in metric_names(report):
            value = (entry.get("metrics") or {}).get(metric)
            if value is not None:
                scalars.append((f"models/{metric}_vs_params", float(value), int(entry["params"])))
                hparams[f"{name}/{metric}"] = float(value)
    return scalars, hparams


def metric_names(report: dict[str, Any]) -> list[str]:
    """The table metrics some model of the report has, in table order."""
    present = set(report["dense"].get("metrics") or {})
    for entry in report["pruned"]:
        present |= set(entry.get("metrics") or {})
    return [m for m in TABLE_METRICS if m in present]


def human(count: float, reference: Optional[float] = None) -> str:
    """A count with the unit of ``reference`` (default: its own): ``678730`` -> ``679k``; with the dense model's
    ``72267648`` as reference, ``29600000`` -> ``29.6M``. Three significant digits."""
    unit, suffix = next(((u, s) for u, s in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if abs(reference or count) >= u), (1, ""))
    value = count / unit
    digits = 3 if abs(value) < 1 else 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{digits}f}{suffix}"


def format_metric(metric: str, value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if metric == THROUGHPUT_KEY else f"{100 * value:.2f}"


def rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per model: name, ratios, params (share of dense), FLOPs (share), then the table metrics."""
    dense = report["dense"]
    metrics = metric_names(report)
    out = []
    for name, entry, ratios in [("dense", dense, "-")] + [
        (e["label"], e, f"{e['mlp_ratio']:.2f}/{e['head_ratio']:.2f}") for e in report["pruned"]
    ]:
        out.append([
            name, ratios, f"{human(entry['params'], dense['params'])} {entry['params'] / dense['params']:.0%}",
            f"{human(entry['flops'], dense['flops'])} {entry['flops'] / dense['flops']:.0%}",
            *[format_metric(m, (entry.get("metrics") or {}).get(m)) for m in metrics],
        ])
    return out


def columns(report: dict[str, Any]) -> list[str]:
    return ["model", "mlp/head", "params", "FLOPs"] + [TABLE_METRICS[m][0] for m in metric_names(report)]


def summary_table(report: dict[str, Any]):
    """A rich table, one row per model; it fits 100 columns and folds (never cuts) cells when narrower."""
    from rich import box
    from rich.table import Table

    table = Table(title=f"snapvit-pl: {report['model']['model_name']}", box=box.SIMPLE_HEAD, padding=(0, 1),
                  caption="accuracies in %; ratios: share of MLP neurons / heads removed")
    for column in columns(report):  # the model label never folds; the numbers fold (never cut) when too narrow
        table.add_column(column, justify="left" if column == "model" else "right", overflow="fold",
                         no_wrap=column == "model")
    for row in rows(report):
        table.add_row(*row)
    return table


def report_markdown(report: dict[str, Any], figures: Optional[dict[str, str]] = None) -> str:
    """``report.md``: settings, timings, the summary table and the figures."""
    timings = ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in report["timings"].items())
    search = report["search"]
    fitness = ("" if search.get("best_fitness") is None else
               f", fitness {search['initial_fitness']:.4f} -> {search['best_fitness']:.4f}")
    method = report["method"].get("search") or {}
    lines = [
        f"# Pruning report: {report['model']['model_name']}", "",
        f"- scorer: `{report['method'].get('scorer', {}).get('name', '?')}`",
        f"- search: `{method.get('optimizer', '?')}`, {search.get('evaluations', 0)} evaluations{fitness}"
        + (f" (stopped by {search['stopped_by']})" if search.get("stopped_by") == "max_time" else ""),
        f"- timings: {timings}", f"- elastic scores: `{report['scores_file']}`",
    ]
    skipped = sum(len(files) for files in report.get("skipped_files", {}).values())
    if skipped:
        lines.append(f"- data: {skipped} unreadable file(s) skipped (listed in report.json)")
    if report.get("splits"):
        lines.append("- head/MLP splits chosen by the fitness: " + ", ".join(
            f"{c['label']} head ratio {c['head_ratio']:.2f} (schedule {c['schedule_head_ratio']:.2f})"
            for c in report["splits"]))
    lines += ["", "Accuracies in %; mlp/head: the share of MLP neurons / heads removed.", "",
              "| " + " | ".join(columns(report)) + " |", "|" + "---|" * len(columns(report))]
    lines += ["| " + " | ".join(row) + " |" for row in rows(report)]
    for name, path in (figures or {}).items():
        lines += ["", f"![{name}]({path})"]
    return "\n".join(lines) + "\n"
