"""Stage 4: the run's report (``report.json``, ``report.md``, ``plots/``) and the console summary table."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

from ..io import write_json_atomic, write_text_atomic
from ..models.cost import COST_CONVENTION, macs
from .plots import write_plots
from .state import RunState
from .tables import CAPTION, columns, metric_names, rows, summary_table


def build_report(state: RunState) -> dict[str, Any]:
    """The ``report.json`` content."""
    search = {} if state.search is None else (state.search.summary() | {
        "evaluations_per_rank": state.search.evaluations_per_rank, "resumed_at": state.search.resumed_at, "forward_s": round(state.search.forward_s, 3),
        "history": state.search.history})
    dense = {} if state.dense is None else {"params": state.dense.params, "flops": state.dense.flops,
                                            "macs": macs(state.dense.flops)}
    if state.dense is not None and state.dense.metrics is not None:
        dense["metrics"] = state.dense.metrics
    return {
        "model": state.spec.to_dict() | {"fingerprint": state.fingerprint},
        "method": state.method,
        "units": dict(COST_CONVENTION),
        "timings": state.timings.to_dict(),
        "peak_memory_mb": state.peak_memory_mb, "peak_memory": state.memory_kind,
        "search": search,
        "splits": [asdict(choice) for choice in state.splits],
        "scores_file": state.scores_file,
        "correction": state.correction,
        "skipped_files": state.skipped_files,
        "dense": dense,
        "pruned": [item.record() for item in state.extracted],
        **({"not_run": list(state.not_run)} if state.not_run else {}),
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
    run_dir = Path(run_dir)
    report = build_report(state)
    models = bool(report["pruned"] or report["dense"])  # none: a run that made the scores only
    figures = write_plots(report, run_dir / "plots", on_figure) if plots and models else {}
    write_json_atomic(run_dir / "report.json", report)
    write_text_atomic(run_dir / "report.md", report_markdown(report, {k: f"plots/{p.name}" for k, p in figures.items()}))
    if print_table and models:
        from rich.console import Console

        console = Console()
        if not console.is_terminal:  # a pipe or a file: no width limit, so no folding at the default 80 columns
            console = Console(width=100)
        console.print(summary_table(report))
        if (report.get("correction") or {}).get("hint"):
            console.print(f"note: {report['correction']['hint']}", highlight=False)
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
            as_cut = (entry.get("metrics_as_cut") or {}).get(metric)
            if as_cut is not None:  # a corrected model, as cut: the chart's second line
                scalars.append((f"models/{metric}_as_cut_vs_params", float(as_cut), int(entry["params"])))
                hparams[f"{name}/{metric}_as_cut"] = float(as_cut)
    return scalars, hparams


def _gram(scorer: dict[str, Any]) -> str:
    """`` (gram: full; auto: ...)`` for a scorer that resolved its Gram form, else nothing."""
    return f" (gram: {scorer['gram_used']}; {scorer['gram_why']})" if scorer.get("gram_used") else ""


#: What each stage a run leaves out means (report.md).
NOT_RUN = {"search": "search (no SearchCallback: the block coefficients stay at their initial values)",
           "export": "export (no ExportCallback: the elastic scores only, no models)",
           "report": "report"}


def report_markdown(report: dict[str, Any], figures: Optional[dict[str, str]] = None) -> str:
    """``report.md``: settings, timings, the summary table and the figures."""
    timings = ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in report["timings"].items())
    search = report["search"]
    fitness = ("" if search.get("best_fitness") is None else
               f", fitness {search['initial_fitness']:.4f} -> {search['best_fitness']:.4f}")
    method = report["method"].get("search") or {}
    lines = [
        f"# Pruning report: {report['model']['model_name']}", "",
        f"- scorer: `{report['method'].get('scorer', {}).get('name', '?')}`" + _gram(report['method'].get('scorer', {})),
        (f"- search: `{method.get('optimizer', '?')}`, {search.get('evaluations', 0)} evaluations{fitness}"
         + (f" (stopped by {search['stopped_by']})" if search.get("stopped_by") == "max_time" else ""))
        if method.get("max_evaluations") else
        f"- search: none (block coefficients from {method.get('initial_range', [1, 1])[0]:g} to "
        f"{method.get('initial_range', [1, 1])[-1]:g})",
        f"- stages not made: {', '.join(NOT_RUN[stage] for stage in report['not_run'])}" if report.get("not_run") else "",
        f"- timings: {timings}", f"- elastic scores: `{report['scores_file']}`",
    ]
    correction = report.get("correction") or {}
    if correction:
        steps = f", {correction['reconstruct_steps']} reconstruction steps per pruned block" \
            if correction.get("reconstruct_steps") else ""
        fewer = f" ({correction['num_samples_asked']} asked; {correction['fewer_because']})" \
            if correction.get("num_samples_asked") else ""
        checked = [e for e in report["pruned"] if (e.get("correction") or {}).get("output_check")]
        held = next((e["correction"]["held_out_images"] for e in checked), 0)
        kept = sum(e["correction"]["kept"] == "corrected" for e in checked)
        others = ", the others as cut (closer to the dense model)" if kept < len(checked) else ""
        check = (f"; {held} of them held out to judge each model: {kept} of {len(checked)} models kept corrected"
                 f"{others}" if checked else "")
        lines.append(f"- weight correction: `{correction['method']}`, {correction['num_samples']} calibration images"
                     f"{fewer}{steps}{check}"
                     if correction["applied"] else "- weight correction: off" + (
                         f" ({correction['hint']})" if correction.get("hint") else ""))
    if report.get("peak_memory_mb"):
        lines.append(f"- peak memory ({report.get('peak_memory', '')}): " + ", ".join(
            f"{stage} {mb:,.0f} MiB" for stage, mb in report["peak_memory_mb"].items()))
    skipped = sum(len(files) for files in report.get("skipped_files", {}).values())
    if skipped:
        lines.append(f"- data: {skipped} unreadable file(s) skipped (listed in report.json)")
    if report.get("splits"):
        requested = [c for c in report["splits"] if c["requested"]]
        grid = len(report["splits"]) - len(requested)
        removed = {e["label"]: e["head_ratio"] for e in report["pruned"]}  # what the saved model's widths remove

        def split(c: dict[str, Any]) -> str:
            cut = f" -> {removed[c['label']]:.2f} removed" if c["label"] in removed else ""
            return f"{c['label']} head ratio {c['head_ratio']:.2f} (schedule {c['schedule_head_ratio']:.2f}){cut}"

        lines.append("- head/MLP splits chosen by the fitness: " + ", ".join(map(split, requested)) + (
            f"; {grid} more on a grid of kept parameter and FLOPs fractions (a budget cut later with this run's data, "
            "`snapvit-pl extract --config <run>/config.yaml`, gets its own race; without the data, a split "
            "interpolated between them)"
            if grid else ""))
    lines = [line for line in lines if line]
    if report["pruned"] or report["dense"]:
        lines += ["", CAPTION[0].upper() + CAPTION[1:] + ".", "",
                  "| " + " | ".join(columns(report)) + " |", "|" + "---|" * len(columns(report))]
        lines += ["| " + " | ".join(row) + " |" for row in rows(report)]
    for name, path in (figures or {}).items():
        lines += ["", f"![{name}]({path})"]
    return "\n".join(lines) + "\n"
