"""Figures of a run (matplotlib, headless): accuracy against size, kept units per block, the search's progress."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from ..eval.suite import THROUGHPUT_KEY
from .tables import TABLE_METRICS, human, metric_names

Figure = Any  # matplotlib.figure.Figure (matplotlib is imported lazily)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def accuracy_figure(report: dict[str, Any], size: str) -> Optional[Figure]:
    """Every accuracy metric against ``size`` (``params`` or ``flops``) for the dense and each pruned model."""
    metrics = [m for m in metric_names(report) if m != THROUGHPUT_KEY]
    if not metrics:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    dense, pruned = report["dense"], sorted(report["pruned"], key=lambda e: e[size])
    for metric in metrics:
        points = [(e[size], 100 * e["metrics"][metric]) for e in pruned if metric in (e.get("metrics") or {})]
        line, = ax.plot(*zip(*points), marker="o", label=TABLE_METRICS[metric][1]) if points else (None,)
        if metric in (dense.get("metrics") or {}):
            color = line.get_color() if line is not None else None
            ax.plot([dense[size]], [100 * dense["metrics"][metric]], marker="*", markersize=13, color=color,
                    linestyle="none")
    ax.plot([], [], marker="*", markersize=13, color="black", linestyle="none", label="dense (stars)")
    name = "parameters" if size == "params" else "FLOPs per image (2 per multiply-accumulate)"
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: human(value, dense[size])))
    ax.margins(x=0.08, y=0.12)
    measured = [what for what, keys in (("top-1", [m for m in metrics if m.endswith("_top1")]),
                                        ("mIoU", [m for m in metrics if m == "seg_miou"])) if keys]
    ax.set(xlabel=name, ylabel=f"{' / '.join(measured) or 'accuracy'} (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="lower right")
    fit_title(fig, ax, f"{report['model']['model_name']}: accuracy against {name}")
    # each budget's label next to its highest point, where no line crosses it (placed once the layout is final)
    place_labels(fig, ax, [(e["label"], (e[size], 100 * max((e.get("metrics") or {}).get(m, 0) for m in metrics)))
                           for e in pruned])
    return fig


#: Where a point's label may go, in order of preference: (offset in points, horizontal, vertical alignment).
LABEL_SPOTS = (((0, 7), "center", "bottom"), ((-5, 5), "right", "bottom"), ((5, 5), "left", "bottom"),
               ((0, -8), "center", "top"), ((-5, -5), "right", "top"), ((5, -5), "left", "top"))


def label_boxes_crossed(fig: Figure, ax: Any) -> list[str]:
    """The labels of ``ax`` (its annotations) that a plotted line crosses or another label overlaps."""
    from matplotlib.path import Path as Polyline

    renderer = fig.canvas.get_renderer()
    lines = [Polyline(line.get_transform().transform(line.get_xydata())) for line in ax.get_lines()
             if len(line.get_xydata()) > 1 and line.get_linestyle() not in ("none", "None", "")]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts]
    return [text for i, (text, box) in enumerate(boxes)
            if any(line.intersects_bbox(box, filled=False) for line in lines)
            or any(box.overlaps(other) for j, (_, other) in enumerate(boxes) if j != i)]


def place_labels(fig: Figure, ax: Any, labels: list[tuple[str, tuple[float, float]]]) -> None:
    """Annotate each ``(text, (x, y))`` at the first of :data:`LABEL_SPOTS` that no line crosses and no label placed
    before overlaps (the first spot when none is free)."""
    fig.canvas.draw()
    for text, xy in labels:
        for offset, ha, va in LABEL_SPOTS:
            note = ax.annotate(text, xy, textcoords="offset points", xytext=offset, ha=ha, va=va, fontsize=7,
                               color="gray")
            if text not in label_boxes_crossed(fig, ax):
                break
            note.remove()
        else:
            offset, ha, va = LABEL_SPOTS[0]
            ax.annotate(text, xy, textcoords="offset points", xytext=offset, ha=ha, va=va, fontsize=7, color="gray")


def fit_title(fig: Figure, ax: Any, title: str) -> None:
    """Give ``ax`` the title ``title``, wrapped onto as many lines as it takes to fit the figure's width (a long model
    name and axis were cut off at the right), then lay the figure out."""
    import textwrap

    width = len(title)
    while True:
        ax.set_title(textwrap.fill(title, width, break_on_hyphens=False, break_long_words=True))
        fig.tight_layout()
        box = ax.title.get_window_extent(renderer=fig.canvas.get_renderer())
        if width <= 10 or (box.x0 >= 0 and box.x1 <= fig.bbox.x1):
            return
        centre = (box.x0 + box.x1) / 2  # (the title is centred over the axes, not over the figure)
        room = 2 * min(centre - fig.bbox.x0, fig.bbox.x1 - centre)
        width = max(10, min(width - 1, int(width * room / max(box.width, 1))))


def kept_units_figure(report: dict[str, Any]) -> Optional[Figure]:
    """Heatmaps of the kept heads and the kept MLP width per block, one row per model (counts written in)."""
    pruned = report["pruned"]
    if not pruned:
        return None
    plt = _pyplot()
    import numpy as np

    labels = [e["label"] for e in pruned]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(labels) + 2.2))
    for ax, key, title in ((axes[0], "heads", "kept attention heads"), (axes[1], "mlp_hidden", "kept MLP width")):
        values = np.array([e[key] for e in pruned], dtype=float)
        image = ax.imshow(values, aspect="auto", cmap="viridis", vmin=0, vmax=max(values.max(), 1))
        for (row, col), value in np.ndenumerate(values):
            ax.text(col, row, f"{value:.0f}", ha="center", va="center", fontsize=8,
                    color="white" if value < 0.6 * values.max() else "black")
        ax.set_xticks(range(values.shape[1]), [str(b) for b in range(values.shape[1])])
        ax.set_yticks(range(len(labels)), labels)
        ax.set(xlabel="block", title=title)
        fig.colorbar(image, ax=ax, label="heads" if key == "heads" else "neurons")
    fig.tight_layout()
    return fig


def search_figure(report: dict[str, Any]) -> Optional[Figure]:
    """The search's best fitness (and each generation's best and median) against evaluations."""
    search = report.get("search") or {}
    history = search.get("history") or []
    if not history:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    evaluations = [h["evaluations"] for h in history]
    ax.plot(evaluations, [h["generation_median"] for h in history], color="lightgray", marker=".", label="generation median")
    ax.plot(evaluations, [h["generation_best"] for h in history], color="gray", marker=".", label="generation best")
    ax.plot([0] + evaluations, [search["initial_fitness"]] + [min(h["best_fitness"], search["initial_fitness"])
                                                            for h in history], linewidth=2.5, label="best so far")
    ax.axhline(search["initial_fitness"], color="black", linestyle="--", linewidth=1, label="initial coefficients")
    optimizer = (report["method"].get("search") or {}).get("optimizer", "")
    ax.set(xlabel="fitness evaluations", ylabel="embedding drift (1 - cosine, PCA space)",
           title=f"coefficient search ({optimizer}): lower is better")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable[[dict[str, Any]], Optional[Figure]]] = {
    "accuracy_vs_params": lambda report: accuracy_figure(report, "params"),
    "accuracy_vs_flops": lambda report: accuracy_figure(report, "flops"),
    "kept_units": kept_units_figure,
    "search_fitness": search_figure,
}


def write_plots(report: dict[str, Any], directory: str | Path,
                on_figure: Optional[Callable[[str, Figure], None]] = None) -> dict[str, Path]:
    """Render every figure the report has data for into ``directory/<name>.png`` (atomically); returns the paths.

    Args:
        report: a ``report.json`` dict.
        directory: where the PNGs go.
        on_figure: also receives each figure before it is closed (e.g. TensorBoard's ``add_figure``).
    """
    from ..io import atomic_path

    plt = _pyplot()
    written = {}
    for name, make in FIGURES.items():
        fig = make(report)
        if fig is None:
            continue
        with atomic_path(Path(directory) / f"{name}.png") as tmp:
            fig.savefig(tmp, dpi=110, format="png")
        if on_figure is not None:
            on_figure(name, fig)
        plt.close(fig)
        written[name] = Path(directory) / f"{name}.png"
    return written
