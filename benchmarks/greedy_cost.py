"""What the Gauss-Newton greedy's order costs, before and after it lost its host synchronisations (issue 45).

The order (:func:`snapvit_pl.scoring.gram.greedy_positions`) is timed on one CPU thread on synthetic Grams of
the shapes of ViT-B/16, ViT-L/14 and ViT-g/14 (their blocks, heads and MLP neurons; the Gram form ``gram: auto``
takes on a CPU: the exact upper block triangle for ViT-B, block Grams + a rank-512 Nystrom sketch above), and the
host synchronisations of each order are counted (:class:`snapvit_pl.device.HostSyncs`: every read-back of a value,
every data-dependent shape, every copy to the host: what would each make the host wait for a GPU). *Before* is the
greedy as it landed at commit :data:`BEFORE` (read from git, run on the same Gram); *after* is this checkout's. Both
orders are compared unit by unit, on the synthetic Grams and on the Grams of the five development models (the
default scorer's own importance pass over the pruning images ``prune.py`` uses).

    OMP_NUM_THREADS=1 python benchmarks/greedy_cost.py                 # -> benchmarks/results/greedy_cost.{json,md}
    OMP_NUM_THREADS=1 python benchmarks/greedy_cost.py --tiny          # smoke run: small shapes, no results file
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import MODELS, RESULTS, machine_info, model_overrides, parse_args, prune_setup, write_results  # noqa: E402
from snapvit_pl.device import HostSyncs  # noqa: E402
from snapvit_pl.scoring import gauss_newton, gram  # noqa: E402
from snapvit_pl.scoring.gram import BlockRowGram, LowRankGram, resolve_gram  # noqa: E402

#: The commit whose greedy is "before": the one the lent H200 could not finish ViT-L/14 with.
BEFORE = "39ea5ba"
#: name -> (blocks, heads, MLP neurons per block), as timm builds them
SHAPES = {
    "ViT-B/16": (12, 12, 3072),
    "ViT-L/14": (24, 16, 4096),
    "ViT-g/14": (40, 24, 4096),  # SwiGLU: 4096 hidden units, both halves pruned together
}
TINY_SHAPES = {"tiny-4": (4, 4, 96), "tiny-8": (8, 6, 160)}
#: rows of mask gradients the synthetic Grams are summed from (the low-rank form: twice its rank, as a real pass of
#: 1000 images x 4 probes gives more than its rank; fewer would make the Nystrom core singular)
ROWS = {"full": 64, "block": 64, "lowrank": 2 * gram.DEFAULT_RANK}


def landed_greedy() -> Any:
    """The module ``snapvit_pl/scoring/gauss_newton.py`` as it was at :data:`BEFORE` (its imports resolve to this
    checkout's modules, which it only takes names from)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:snapvit_pl/scoring/gauss_newton.py"],
                            capture_output=True, text=True, check=True).stdout
    spec = importlib.util.spec_from_loader("snapvit_pl.scoring._gauss_newton_before", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "snapvit_pl.scoring"
    from snapvit_pl.scoring import Scorer

    registered = dict(Scorer.registry)  # (the old class names itself gn_greedy too: it is timed, never registered)
    Scorer.registry.pop("gn_greedy", None)
    try:
        exec(compile(source, f"{BEFORE}:gauss_newton.py", "exec"), module.__dict__)
    finally:
        Scorer.registry.clear()
        Scorer.registry.update(registered)
    return module


def unit_layout(blocks: int, heads: int, neurons: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cost, group, removable) as :meth:`GaussNewtonGreedy.compute` makes them for a ViT of this shape: a head owns
    ``4 * dim * dim / heads`` weights (qkv rows and proj columns), a neuron ``2 * dim``; the default keep ratios."""
    from snapvit_pl.models.units import MIN_HEAD_KEEP, MIN_MLP_KEEP, min_kept

    sizes = [heads, neurons] * blocks
    group = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    cost = torch.cat([torch.full((n,), 4.0 * dim * dim / heads if i % 2 == 0 else 2.0 * dim, dtype=torch.float64)
                      for i, n in enumerate(sizes)])
    removable = torch.tensor([n - min_kept(n, MIN_HEAD_KEEP if i % 2 == 0 else MIN_MLP_KEEP) for i, n in enumerate(sizes)])
    return cost, group, removable


def synthetic_gram(blocks: int, heads: int, neurons: int, form: str) -> tuple[BlockRowGram, dict[str, torch.Tensor]]:
    """A Gram of this shape from :data:`ROWS` random gradient rows (each unit its own scale, as real units differ)."""
    sizes = [heads + neurons] * blocks
    layout = LowRankGram(sizes, gram.DEFAULT_RANK, 0) if form == "lowrank" else BlockRowGram(sizes, form == "full")
    state = layout.zeros(torch.float32, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    scale = torch.exp(torch.randn(sum(sizes), generator=generator))
    for _ in range(ROWS[form] // 16):
        layout.accumulate(state, torch.randn(16, sum(sizes), generator=generator) * scale)
    return layout, state


def before_state(layout: BlockRowGram, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same accumulators in the landed layout: one tensor per block row (views of the flat buffer)."""
    return {**{f"gram.{i}": layout.block_row(state, i) for i in range(len(layout.sizes))},
            **({"sketch": state["sketch"]} if "sketch" in state else {})}


def with_shortcut(on: bool, run: Any) -> Any:
    """``run()`` with the CPU's shortcuts (:data:`snapvit_pl.scoring.gram.CPU_SHORTCUT`) on or off."""
    before, gram.CPU_SHORTCUT = gram.CPU_SHORTCUT, on
    try:
        return run()
    finally:
        gram.CPU_SHORTCUT = before


def after_orders(run: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """This checkout's order as a CPU run takes it (the shortcuts on: timed) and as an accelerator does (off: its host
    synchronisations counted, timed too); both orders must agree."""
    order, seconds, _, _ = timed_order(lambda: with_shortcut(True, run))
    plain, plain_s, syncs, ops = timed_order(lambda: with_shortcut(False, run))
    assert torch.equal(order, plain), "the CPU shortcut changed the order"
    return order, {"seconds": seconds, "seconds_without_shortcut": plain_s, "syncs": syncs, "by_operator": ops}


def timed_order(run: Any) -> tuple[torch.Tensor, float, int, dict[str, int]]:
    """(positions, seconds, host synchronisations, by operator) of ``run()``: counted on the first run (what a fresh
    order syncs, its index maps built), then timed alone on a second (the counter sees every tensor operation from
    Python, which slows an order of many small operations several times: the development models' orders were once
    timed under it)."""
    with HostSyncs() as syncs:
        counted = run()
    start = time.perf_counter()
    positions = run()
    seconds = time.perf_counter() - start
    assert torch.equal(counted, positions), "the order changed between two runs on the same Gram"
    return positions, seconds, syncs.count, dict(syncs.operators)


def compare(before: torch.Tensor, after: torch.Tensor) -> dict[str, Any]:
    """How far two orders agree: identical units, units whose position differs, Spearman's rho."""
    n = before.numel()
    rho = 1 - 6 * float(((before - after) ** 2).sum()) / (n * (n * n - 1))
    return {"identical": bool(torch.equal(before, after)), "units_moved": int((before != after).sum()), "spearman": rho}


def shape_row(name: str, shape: tuple[int, int, int], dim: int, landed: Any, skip_before: bool) -> dict[str, Any]:
    blocks, heads, neurons = shape
    sizes = [heads + neurons] * blocks
    form, why = resolve_gram("auto", sizes, torch.device("cpu"), torch.float32)
    started = time.perf_counter()
    layout, state = synthetic_gram(blocks, heads, neurons, form)
    build_s = time.perf_counter() - started
    cost, group, removable = unit_layout(blocks, heads, neurons, dim)
    w = gauss_newton.DEFAULT_CROSS_WEIGHT
    after, timing = after_orders(lambda: gram.greedy_positions(layout, state, cost, group, removable,
                                                               gram.GREEDY_STEPS, w))
    row = {"model": name, "blocks": blocks, "heads": heads, "neurons": neurons, "units": sum(sizes),
           "removable": int(removable.sum()), "steps": min(gram.GREEDY_STEPS, int(removable.sum())),
           "gram": form, "gram_why": why, "gram_build_s": build_s, "after": timing}
    print(f"{name}: after {timing['seconds']:.1f} s ({timing['seconds_without_shortcut']:.1f} s without the CPU "
          f"shortcut), {timing['syncs']} syncs", flush=True)
    if not skip_before:
        old_layout = (landed.LowRankGram(layout.sizes, layout.rank, layout.seed) if form == "lowrank" else
                      landed.BlockRowGram(layout.sizes, form == "full"))
        before, before_s, before_syncs, before_ops = timed_order(lambda: landed.greedy_positions(
            old_layout, before_state(layout, state), cost, group, removable, gram.GREEDY_STEPS, w))
        row["before"] = {"seconds": before_s, "syncs": before_syncs, "by_operator": before_ops}
        row["agreement"] = compare(before, after)
        print(f"{name}: before {before_s:.1f} s, {before_syncs} syncs; {row['agreement']}", flush=True)
    return row


def development_row(name: str, landed: Any, images: Optional[int]) -> dict[str, Any]:
    """The default scorer's Gram of development model ``name`` over its pruning images; both greedies on it."""
    from snapvit_pl.models.units import min_kept
    from snapvit_pl.scoring.base import ScoringContext

    setup = prune_setup(*model_overrides(name), *([f"--data.init_args.max_samples={images}"] if images else []))
    context = ScoringContext(min_mlp_keep=setup.importance.min_mlp_keep, min_head_keep=setup.importance.min_head_keep)
    scorer = setup.importance.scorer.bind(setup.model, context)  # the pass prune.py makes, kept to order
    setup.datamodule.train_views = "plain"
    for batch in setup.datamodule.train_dataloader():
        scorer.update(batch)
    scorer.reduce(lambda t: t)
    sizes = [g.num_units for _, _, g in scorer._groups]
    group = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    keep = [min_kept(g.num_units, context.min_head_keep if kind == "heads" else context.min_mlp_keep)
            for _, kind, g in scorer._groups]
    removable = torch.tensor([n - k for n, k in zip(sizes, keep)])
    cost = scorer._unit_params()
    layout, state = scorer._gram, scorer._acc
    old_layout = (landed.LowRankGram(layout.sizes, layout.rank, layout.seed) if isinstance(layout, LowRankGram) else
                  landed.BlockRowGram(layout.sizes, layout.cross_block))
    after, timing = after_orders(lambda: gram.greedy_positions(layout, state, cost, group, removable, scorer.max_steps,
                                                               scorer.cross_weight))
    before, before_s, before_syncs, _ = timed_order(lambda: landed.greedy_positions(
        old_layout, before_state(layout, state), cost, group, removable, scorer.max_steps, scorer.cross_weight))
    row = {"model": name, "units": sum(sizes), "images": scorer._samples, "gram": scorer.resolved[0],
           "before": {"seconds": before_s, "syncs": before_syncs}, "after": timing,
           "agreement": compare(before, after)}
    print(f"{name}: {row['agreement']}", flush=True)
    return row


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# The greedy order's cost: host synchronisations and time, before and after", "",
        f"`python benchmarks/greedy_cost.py`, {m['date']}, {m['cpu']}, {m['torch_threads']} torch thread, torch "
        f"{m['torch']}, load average {m['load_average_1m_at_end']:.1f} at the end (a busy 2-core machine: other jobs "
        f"slow both columns alike). *Before*: the greedy at commit `{report['before_commit']}`; *after*: this commit's. "
        f"Synthetic Grams summed from random gradient rows ({ROWS['full']} for a full Gram, {ROWS['lowrank']} for the "
        f"low-rank form), in the form `gram: auto` takes on a CPU; the "
        f"default `cross_weight` {report['cross_weight']} and at most {report['max_steps']} steps. *Syncs*: host "
        "synchronisations of one whole order (read-backs, data-dependent shapes, copies to the host), each of which "
        "a GPU run waits for, counted on a first run of the order, which is then timed alone on a second. *After* is timed "
        "as a CPU run takes it, with the CPU shortcuts (`snapvit_pl.scoring.gram.CPU_SHORTCUT`: an uncapped top-k kept "
        "when no group exceeds its cap; one unit per step read from the dense Gram), and without them (the path an "
        "accelerator takes, whose syncs are counted); the two orders are checked identical.", "",
        "| model | units | removable | steps | Gram | order before (s) | after, no CPU shortcut (s) | order after (s) "
        "| syncs before | syncs after | same order |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in report["shapes"]:
        before = r.get("before", {})
        same = r.get("agreement")
        shown = "n/a" if same is None else ("identical" if same["identical"] else
                                            f"{same['units_moved']} units moved (rho {same['spearman']:.6f})")
        lines.append(f"| {r['model']} | {r['units']:,} | {r['removable']:,} | {r['steps']:,} | {r['gram']} | "
                     f"{before.get('seconds', float('nan')):.1f} | {r['after']['seconds_without_shortcut']:.1f} | "
                     f"{r['after']['seconds']:.1f} | "
                     f"{format(before['syncs'], ',') if before else 'n/a'} | {r['after']['syncs']} | {shown} |")
    lines += ["", "Where the syncs after come from (one whole order): " + "; ".join(
        f"{r['model']}: " + ", ".join(f"{k} {v}" for k, v in sorted(r["after"]["by_operator"].items()))
        for r in report["shapes"]) + "."]
    if report.get("development"):
        lines += ["", "## The same orders on the development models' Grams", "",
                  "The default scorer (`GaussNewtonGreedy()`) over each development model's pruning images "
                  "(`configs/prune/demo.yaml`'s data), then both greedies on that Gram:", "",
                  "| model | units | images | Gram | before (s) | after, no CPU shortcut (s) | after (s) | syncs before "
                  "| syncs after | same order |",
                  "|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
        for r in report["development"]:
            a = r["agreement"]
            shown = "identical" if a["identical"] else f"{a['units_moved']} units moved (rho {a['spearman']:.6f})"
            lines.append(f"| {r['model']} | {r['units']:,} | {r['images']} | {r['gram']} | {r['before']['seconds']:.2f} "
                         f"| {r['after']['seconds_without_shortcut']:.2f} | {r['after']['seconds']:.2f} | {r['before']['syncs']:,} | {r['after']['syncs']} | {shown} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(SHAPES), help="shapes to time (names of SHAPES)")
    parser.add_argument("--development", default=",".join(MODELS),
                        help="development models whose Grams both greedies order ('' for none)")
    parser.add_argument("--no-before", action="store_true", help="time this checkout's greedy only")
    parser.add_argument("--tiny", action="store_true", help="small shapes, no development models, no results file")
    args = parse_args(parser, argv)
    torch.set_num_threads(1)
    landed = landed_greedy()
    shapes = TINY_SHAPES if args.tiny else {name: SHAPES[name] for name in args.models.split(",")}
    dims = {"ViT-B/16": 768, "ViT-L/14": 1024, "ViT-g/14": 1536}
    rows = [shape_row(name, shape, dims.get(name, 64), landed, args.no_before) for name, shape in shapes.items()]
    development = [] if args.tiny or not args.development else [
        development_row(name, landed, None) for name in args.development.split(",")]
    report = {"before_commit": BEFORE, "cross_weight": gauss_newton.DEFAULT_CROSS_WEIGHT,
              "max_steps": gram.GREEDY_STEPS, "shapes": rows, "development": development,
              "machine": {**machine_info(), "torch_threads": torch.get_num_threads()}}
    if args.tiny:
        print(markdown(report))
        return 0
    write_results(RESULTS / "greedy_cost", report, markdown, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
