"""The run's numbers as tables: the console summary and report.md's table share these rows and columns."""
from __future__ import annotations

from typing import Any, Optional

from ..eval.suite import THROUGHPUT_KEY
from ..models.cost import macs

#: Metrics shown in the tables and plots (short column label, full name); everything else stays in report.json.
#: An accuracy is a fraction in [0, 1] under its own name everywhere it is stored or logged (report.json, evaluate's
#: JSON, TensorBoard, the Python API); where it is shown in percent, the label says so (``k-NN %``, ``knn%``).
TABLE_METRICS = {
    "knn_top1": ("k-NN %", "weighted k-NN top-1"), "linear_top1": ("linear %", "linear-probe top-1"),
    "head_top1": ("head %", "own-head top-1"), "seg_miou": ("seg %", "segmentation mIoU"),
    THROUGHPUT_KEY: ("img/s", "images per second"),
}


def percent_label(metric: str) -> str:
    """How progress lines name a metric shown in percent: ``knn_top1`` -> ``knn%``, ``seg_miou`` -> ``seg_miou%``."""
    return f"{metric.removesuffix('_top1')}%"


#: Under every table of a run: what the columns measure (FLOPs and MACs per image: :data:`COST_CONVENTION`).
CAPTION = ("%: accuracies in percent (report.json, TensorBoard: fractions); ratios: share of MLP neurons / heads "
           "removed; FLOPs per image, 2 per multiply-accumulate; MACs: multiply-accumulates per image (what papers "
           "call FLOPs)")


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


def as_cut_names(report: dict[str, Any]) -> list[str]:
    """The table metrics some corrected model was also measured on as cut (shown beside the corrected ones)."""
    present = set()
    for entry in report["pruned"]:
        present |= set(entry.get("metrics_as_cut") or {})
    return [m for m in metric_names(report) if m in present and m != THROUGHPUT_KEY]


def correction_cell(entry: dict[str, Any]) -> str:
    """What the correction did to one model and its seconds: ``-`` (none), ``3.1s`` (corrected in 3.1 s), ``cut
    2.0s`` (the output check kept the model as cut)."""
    record = entry.get("correction")
    if not record:
        return "-"
    seconds = f"{record['seconds']:.1f}s" if record.get("seconds") is not None else ""
    return " ".join(filter(None, ("cut" if record.get("kept") == "as cut" else "", seconds))) or "yes"


def rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per model: name, ratios, params (share of dense), FLOPs (share), then the table metrics (each accuracy
    as cut beside it when the models are corrected, and what the correction did)."""
    dense = report["dense"]
    metrics, as_cut = metric_names(report), as_cut_names(report)
    out = []
    for name, entry, ratios in [("dense", dense, "-")] + [
        (e["label"], e, f"{e['mlp_ratio']:.2f}/{e['head_ratio']:.2f}") for e in report["pruned"]
    ]:
        cells = []
        for m in metrics:
            if m in as_cut:
                cells.append(format_metric(m, (entry.get("metrics_as_cut") or entry.get("metrics") or {}).get(m)))
            cells.append(format_metric(m, (entry.get("metrics") or {}).get(m)))
        out.append([
            name, ratios, f"{human(entry['params'], dense['params'])} {entry['params'] / dense['params']:.0%}",
            f"{human(entry['flops'], dense['flops'])} {entry['flops'] / dense['flops']:.0%}",
            human(macs(entry['flops']), macs(dense['flops'])), *cells,
            *([correction_cell(entry) if entry is not dense else "-"] if as_cut else []),
        ])
    return out


def columns(report: dict[str, Any]) -> list[str]:
    """The table's column labels: with corrected models, each accuracy as cut (``k-NN % cut``) then the model's own,
    corrected (``k-NN %``), and the correction's outcome and seconds per model (``corr.``)."""
    as_cut = as_cut_names(report)
    labels = []
    for m in metric_names(report):
        short = TABLE_METRICS[m][0]
        labels += [f"{short} cut", short] if m in as_cut else [short]
    return ["model", "mlp/head", "params", "FLOPs", "MACs", *labels, *(["corr."] if as_cut else [])]


def summary_table(report: dict[str, Any]):
    """A rich table, one row per model; it fits 100 columns and folds (never cuts) cells when narrower."""
    from rich import box
    from rich.table import Table

    table = Table(title=f"snapvit-pl: {report['model']['model_name']}", box=box.SIMPLE_HEAD, padding=(0, 1),
                  caption=CAPTION)
    for column in columns(report):  # the model label and ratios never fold; the numbers fold (never cut) when narrow
        table.add_column(column, justify="left" if column == "model" else "right", overflow="fold",
                         no_wrap=column in ("model", "mlp/head"))
    for row in rows(report):
        table.add_row(*row)
    return table
