"""A training run's log as a per-epoch Markdown table, from its TensorBoard events (what ships beside a development
model in ``assets/<model>/training_log.md``).

    python benchmarks/training_log.py runs/clutter_fmnist assets/clutter_vit_fmnist/training_log.md

Per epoch: the mean training loss over the logged steps, the epoch's monitor metrics (``val/accuracy``,
``knn/top1``, ... whatever the run logged once per epoch), the learning rate at the epoch's end, and the wall time
between the epoch's first and last logged step (``resumed`` marks an epoch that started in another process).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import parse_args, write_markdown  # noqa: E402

STEP_TAGS = ("train/loss",)
IGNORED = ("epoch", "hp_metric")


def read_scalars(run_dir: Path) -> dict[str, list[tuple[float, int, float]]]:
    """``tag -> [(wall_time, step, value)]`` over every event file under ``run_dir`` (a resumed run has several)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[float, int, float]]] = defaultdict(list)
    files = sorted(run_dir.rglob("events.out.tfevents.*"))
    if not files:
        raise SystemExit(f"error: no TensorBoard event files under {run_dir}; give the run's --trainer.default_root_dir")
    for path in files:
        events = EventAccumulator(str(path), size_guidance={"scalars": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            scalars[tag] += [(e.wall_time, e.step, e.value) for e in events.Scalars(tag)]
    return {tag: sorted(values, key=lambda v: (v[1], v[0])) for tag, values in scalars.items()}


def epochs(scalars: dict[str, list[tuple[float, int, float]]]) -> list[dict[str, Any]]:
    """One row per epoch (epoch boundaries from Lightning's ``epoch`` scalar)."""
    epoch_of = {step: int(value) for _, step, value in scalars.get("epoch", [])}
    if not epoch_of:
        raise SystemExit("error: the run logged no 'epoch' scalar; is it a Lightning run with a TensorBoard logger?")
    rows: dict[int, dict[str, Any]] = {}

    def row(step: int) -> Optional[dict[str, Any]]:
        epoch = epoch_of.get(step)
        if epoch is None:  # a step Lightning logged nothing else at: the nearest earlier logged step's epoch
            earlier = [s for s in epoch_of if s <= step]
            epoch = epoch_of[max(earlier)] if earlier else 0
        return rows.setdefault(epoch, {"epoch": epoch, "losses": [], "times": [], "metrics": {}})

    for tag, values in scalars.items():
        if tag in IGNORED:
            continue
        for wall, step, value in values:
            entry = row(step)
            entry["times"].append(wall)
            if tag in STEP_TAGS:
                entry["losses"].append(value)
            elif tag.startswith("lr-"):
                entry["metrics"]["lr"] = value
            elif not tag.startswith("train/"):
                entry["metrics"][tag] = value
    return [rows[e] for e in sorted(rows)]


def markdown(run_dir: Path, rows: list[dict[str, Any]]) -> str:
    metrics = sorted({m for r in rows for m in r["metrics"]} - {"lr"}) + ["lr"]
    lines = [f"# Training log of `{run_dir.name}`", "",
             f"From the TensorBoard events of `{run_dir}` (`python benchmarks/training_log.py`). Loss: mean of the "
             "logged training steps of the epoch; metrics: as logged at the epoch's end (monitors only: no epoch is "
             "selected on them); minutes: from the epoch's first to its last logged step.", "",
             "| epoch | train loss | " + " | ".join(metrics) + " | minutes |", "|---:|---:|" + "---:|" * (len(metrics) + 1)]
    for r in rows:
        values = [r["metrics"].get(m) for m in metrics]
        cells = ["-" if v is None else (f"{v:.2e}" if m == "lr" else f"{100 * v:.2f}%" if v <= 1 and "top1" in m or
                                        "accuracy" in m else f"{v:.4f}") for m, v in zip(metrics, values)]
        minutes = (max(r["times"]) - min(r["times"])) / 60 if r["times"] else 0.0
        loss = f"{statistics.fmean(r['losses']):.4f}" if r["losses"] else "-"
        lines.append(f"| {r['epoch']} | {loss} | " + " | ".join(cells) + f" | {minutes:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="the training run's directory (its --trainer.default_root_dir)")
    parser.add_argument("out", type=Path, help="the Markdown file to write")
    args = parse_args(parser, argv)
    text = markdown(args.run_dir, epochs(read_scalars(args.run_dir)))
    write_markdown(args.out, text, args)
    print(text)


if __name__ == "__main__":
    main()
