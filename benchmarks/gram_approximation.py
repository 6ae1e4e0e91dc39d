"""The Gauss-Newton greedy's scalable forms against the exact full Gram, on every development model.

For each model and seed, the removal order of each form (``research_scores.py``'s ``gn4_*`` variants, the same 4
probes and pruning images; their local scores from its cache, computed when missing) is compared with the exact
full Gram's (``gn4_full``):

- *Spearman*: the rank correlation of the two orders, heads and MLP neurons apart (every unit of every block);
- *cut agreement*: the share of the units the exact order removes at (0.65, 0.5) (about 41% of the parameters
  kept: 65% of the neurons, 50% of the heads) that the form removes too;
- accuracy at 51 / 41% of the parameters on held-out train images, from ``research_scores.py``'s records of the
  same variants (``benchmarks/results/research/holdout.jsonl``; run it first for the accuracies).

    OMP_NUM_THREADS=1 python benchmarks/gram_approximation.py          # -> benchmarks/results/gram_approximation.{json,md}
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import MODELS, RESULTS, Progress, model_overrides, parse_args, prune_setup, write_results  # noqa: E402
from benchmarks.research_scores import CACHE, PAIRS, REPORTED, RESEARCH, TITLES, VARIANTS, local_scores  # noqa: E402
from snapvit_pl.elastic.ranking import select_subnet  # noqa: E402

EXACT = "gn4_full"
FORMS = {
    "gn4_block": "block-diagonal Gram (no cross-block terms)",
    "gn4_lowrank32": "block Grams + Nystrom cross-block terms, rank 32",
    "gn4_lowrank128": "block Grams + Nystrom cross-block terms, rank 128",
    "gn4_lowrank512": "block Grams + Nystrom cross-block terms, rank 512",
    "gn4_steps256": "full Gram, greedy in 256 steps (ViT-B/16's units per step)",
}
CUT = (0.65, 0.5)  # (mlp, head) ratios removed: about 41% of the parameters kept


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = a.argsort().argsort().double(), b.argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra @ rb) / (ra.norm() * rb.norm()))


def removed(scores, setup) -> set[tuple[str, int, int]]:
    """The units the cut at :data:`CUT` removes."""
    imp = setup.importance
    subnet = select_subnet(scores.heads, scores.neurons, *CUT, imp.min_mlp_keep, imp.min_head_keep)
    gone = set()
    for kind, kept, per_block in (("h", subnet.heads, scores.heads), ("n", subnet.neurons, scores.neurons)):
        for b, (k, s) in enumerate(zip(kept, per_block)):
            gone |= {(kind, b, u) for u in set(range(len(s))) - set(k.tolist())}
    return gone


def agreement(models: list[str], seeds: list[int], log: Progress) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in models:
        for seed in seeds:
            setup = prune_setup(*model_overrides(model), f"--data.init_args.seed={seed}", f"--search.seed={seed}")
            exact, _, _ = local_scores(VARIANTS[EXACT], setup, model, seed, CACHE)
            exact_removed = removed(exact, setup)
            for form in FORMS:
                scores, seconds, hit = local_scores(VARIANTS[form], setup, model, seed, CACHE)
                log(f"{model} seed {seed} {form}: scores {'cached' if hit else 'computed'}")
                entry = out.setdefault(model, {}).setdefault(form, {"heads": [], "neurons": [], "cut": []})
                entry["heads"].append(spearman(torch.cat(exact.heads), torch.cat(scores.heads)))
                entry["neurons"].append(spearman(torch.cat(exact.neurons), torch.cat(scores.neurons)))
                entry["cut"].append(len(exact_removed & removed(scores, setup)) / len(exact_removed))
    return out


def accuracies(path: Path, models: list[str], seeds: list[int]) -> dict[str, Any]:
    """model -> variant -> metric -> [mean at 51%, mean at 41%] over the recorded runs of ``seeds`` (and their count:
    the forms and the exact Gram on the same seeds, so that their differences are paired)."""
    out: dict[str, Any] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["model"] in models and r["seed"] in seeds and (r["variant"] in FORMS or r["variant"] == EXACT):
            out.setdefault(r["model"], {}).setdefault(r["variant"], []).append(r)
    table: dict[str, Any] = {}
    for model, variants in out.items():
        for variant, runs in variants.items():
            table.setdefault(model, {})[variant] = {"seeds": len(runs), **{
                key: [statistics.fmean(100 * r["rows"][PAIRS.index(p)][key] for r in runs) for p in PAIRS[-2:]]
                for key in REPORTED if runs[0]["rows"][0].get(key) is not None}}
    return table


def markdown(report: dict[str, Any]) -> str:
    lines = ["# The Gauss-Newton greedy's scalable forms against the exact full Gram", "",
             "`python benchmarks/gram_approximation.py`: each form's removal order against the exact full Gram's "
             f"(`{EXACT}`), on the same 4 probes and pruning images, mean over seeds {report['seeds']} (min in "
             "brackets). Spearman: rank correlation of the orders (heads, neurons); cut: the share of the units the "
             f"exact order removes at (mlp, head) = {CUT} (about 41% of the parameters kept) that the form removes too. "
             "Accuracy: top-1 on held-out train images at about 51 / 41% of the parameters (`research_scores.py`'s "
             "records of the same variants; each form minus the exact Gram's, in points).", ""]
    for model, forms in report["agreement"].items():
        acc = report["accuracy"].get(model, {})
        keys = [k for k in REPORTED if k in acc.get(EXACT, {})]
        exact = acc.get(EXACT, {})
        lines += [f"**{model}**", ""]
        if exact:
            lines += ["Exact full Gram: " + "; ".join(f"{TITLES[k]} {exact[k][0]:.2f} / {exact[k][1]:.2f}" for k in keys)
                      + f" [{exact['seeds']} seeds]", ""]
        lines += ["| form | Spearman heads | Spearman neurons | cut | "
                  + " | ".join(f"{TITLES[k]} 51 / 41%" for k in keys) + " |",
                  "|---|---:|---:|---:|" + "---:|" * len(keys)]
        for form, entry in forms.items():
            cells = [f"{statistics.fmean(entry[k]):.3f} ({min(entry[k]):.3f})" for k in ("heads", "neurons", "cut")]
            mine = acc.get(form, {})
            for k in keys:
                cells.append("-" if k not in mine else
                             " / ".join(f"{a - b:+.2f}" for a, b in zip(mine[k], exact[k])) + f" [{mine['seeds']}]")
            lines.append(f"| {FORMS[form]} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--records", default=str(RESEARCH / "holdout.jsonl"), help="research_scores.py's records")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/gram_approximation)")
    args = parse_args(parser, argv)
    torch.set_num_threads(args.threads)
    models, seeds = args.models.split(","), [int(s) for s in args.seeds.split(",")]
    log = Progress()
    report = {"seeds": seeds, "agreement": agreement(models, seeds, log),
              "accuracy": accuracies(Path(args.records), models, seeds)}
    write_results(Path(args.out) if args.out else RESULTS / "gram_approximation", report, markdown, args)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
