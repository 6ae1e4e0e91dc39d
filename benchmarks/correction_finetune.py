"""What weight correction and a short fine-tune add to a retraining-free pruned ViT. Not run in CI.

For each budget of ``prune.py``'s default export (10% ... 60% of the parameters removed, each split
between heads and MLP neurons by the fitness), one model is cut from the elastic scores
(:func:`snapvit_pl.pipeline.extract_models`, as ``prune.py`` does) and measured three times:

  (a) pruned:     the cut alone, no retraining;
  (b) corrected:  the cut with the configured correction (the default ``dense_fit``) of ``attn.proj`` / ``mlp.fc2``
                  (``correction.enabled: true`` in ``prune.py``) on 256 calibration images (``correction.num_samples``);
  (c) fine-tuned: (b) trained briefly with ``FinetuneModule`` (``loss: both`` = cross-entropy on labels
                  + KL distillation from the dense model) under a lightweight Trainer: one epoch over
                  ``--finetune-samples`` train images, or ``--finetune-steps N`` optimizer steps.

Each gets weighted k-NN, linear-probe and own-head top-1 (the evaluation ``prune.py`` runs), on the
whole test split by default, and every step is timed.

    python benchmarks/correction_finetune.py [--scores runs/prune/X] [--model reference]
    python benchmarks/correction_finetune.py --quick       # smoke run: 2 budgets, tiny sizes (~20 s)

Scores: ``elastic_scores.safetensors`` of a prune run (``--scores`` takes the run directory or the
file); without it, the default ``prune.py`` scores (SSL Fisher + search, settings of
``configs/prune/demo.yaml``) are computed first.
Writes ``benchmarks/results/correction_finetune.{md,json}`` (``--quick``: ``correction_finetune_quick.*``).
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    MODELS, RESULTS, Progress, PruneSetup, display, machine_info, model_overrides, parse_args, pct, prune_setup,
    write_results,
)
from benchmarks.compare_methods import method_scores  # noqa: E402
from snapvit_pl.data import ClassificationDataModule  # noqa: E402
from snapvit_pl.elastic import Budget, ElasticScores, initial_coefficients  # noqa: E402
from snapvit_pl.errors import SnapViTError, exit_with_error  # noqa: E402
from snapvit_pl.eval.suite import EvalData  # noqa: E402
from snapvit_pl.models import save_pruned  # noqa: E402
from snapvit_pl.pipeline import (  # noqa: E402
    Correction, Evaluation, EvaluationSettings, choose_splits, extract_models, split_table,
)

REPORTED = (("knn_top1", "k-NN"), ("linear_top1", "linear probe"), ("head_top1", "own head"))
STAGES = (("pruned", "(a) pruned"), ("corrected", "(b) corrected"), ("finetuned", "(c) fine-tuned"))


@dataclass
class Settings:
    budgets: Optional[list[dict[str, float]]] = None  # None: prune.py's default export (sparsity 0.1 ... 0.6)
    calibration_images: int = 256
    finetune_samples: Optional[int] = 10000  # one epoch over this seeded train subset (None: the whole split)
    finetune_steps: Optional[int] = None     # instead: exactly this many optimizer steps
    finetune_batch: int = 128
    lr: float = 5e-4
    warmup_fraction: float = 0.1
    distill_weight: float = 1.0
    temperature: float = 1.0
    knn_train: int = 10000
    knn_val: Optional[int] = None  # None: the whole test split
    knn_k: int = 20
    seed: int = 0
    overrides: list[str] = field(default_factory=list)

    def quick(self) -> "Settings":
        return replace(self, budgets=[{"sparsity": 0.3}, {"sparsity": 0.6}], calibration_images=32, finetune_samples=320,
                       finetune_batch=32, knn_train=300, knn_val=100, knn_k=10,
                       overrides=self.overrides + ["--data.init_args.max_samples=64", "--search.max_evaluations=4",
                                                   "--search.num_images=64", "--search.pca_components=16"])


def elastic_scores(scores: Optional[str], setup: PruneSetup, log: Progress) -> tuple[ElasticScores, dict[str, Any]]:
    """``--scores`` (a prune run directory or its elastic_scores.safetensors), else the default prune.py scores."""
    started = time.perf_counter()
    if scores is None:
        result, info = method_scores("ours", setup, log, {})
        return result, {"source": "computed: the default prune.py run", **info,
                        "seconds": time.perf_counter() - started}
    path = Path(scores)
    path = path / "elastic_scores.safetensors" if path.is_dir() else path
    loaded = ElasticScores.load(path)
    loaded.check_model(setup.model)  # same architecture and weights, or a clear error
    if loaded.coefficients is None:
        loaded.coefficients = initial_coefficients(len(loaded.head_scores), loaded.heads_per_block,
                                                   *setup.search.initial_range)
    return loaded, {"source": display(path), "seconds": time.perf_counter() - started,
                    "evaluations": loaded.search.get("evaluations")}


def finetune(model: torch.nn.Module, subnet, setup: PruneSetup, teacher_path: Path, workdir: Path,
             settings: Settings) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(c): FinetuneModule(loss=both, distill=kl) on a pruned-checkpoint copy of ``model``, one short fit."""
    import pytorch_lightning as pl

    from snapvit_pl.lightning.finetune_module import FinetuneModule

    checkpoint = save_pruned(model, workdir / "start", setup.spec, subnet)
    torch.manual_seed(settings.seed)
    module = FinetuneModule(
        checkpoint=str(checkpoint), loss="both", distill="kl", distill_weight=settings.distill_weight,
        temperature=settings.temperature, teacher_checkpoint_path=str(teacher_path), lr=settings.lr,
        warmup_epochs=settings.warmup_fraction, weight_decay=0.05,
    )
    dm = ClassificationDataModule(source="fashion_mnist", batch_size=settings.finetune_batch, seed=settings.seed,
                                  max_samples=settings.finetune_samples, num_workers=0)
    steps = settings.finetune_steps
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, gradient_clip_val=1.0,
        max_epochs=-1 if steps else 1, max_steps=steps or -1,
    )
    started = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    seconds = time.perf_counter() - started
    metrics = trainer.callback_metrics
    info = {"finetune_s": seconds, "steps": trainer.global_step, "images": trainer.global_step * settings.finetune_batch,
            **{f"final_{k}": float(metrics[f"train/{k}"]) if f"train/{k}" in metrics else None
               for k in ("loss", "ce", "distill")}}
    return module.model.eval(), info


def run(settings: Settings, scores: Optional[str], model_name: str, out_prefix: Path, quick: bool,
        threads: Optional[int]) -> dict[str, Any]:
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # no "GPU available" banner per fine-tune
    for message in (".*module\\(s\\) in eval mode", ".*isinstance.treespec, LeafSpec.*"):  # the frozen teacher; a pytree deprecation
        warnings.filterwarnings("ignore", message=message)
    if threads:
        torch.set_num_threads(threads)
    log = Progress()
    setup = prune_setup(*model_overrides(model_name), *settings.overrides)
    model, dm = setup.model, setup.datamodule
    log(f"model: {display(MODELS[model_name])}")
    elastic, scores_info = elastic_scores(scores, setup, log)
    log(f"scores: {scores_info['source']} ({scores_info['seconds']:.1f}s)")

    started = time.perf_counter()
    measured = EvaluationSettings(metrics=["knn", "linear", "head"], train_samples=settings.knn_train,
                                  val_samples=settings.knn_val, batch_size=256, knn_k=settings.knn_k)
    data = EvalData.from_datamodule(dm, measured, cache=True)  # decoded once, for every model
    evaluation = Evaluation(measured, data, torch.device("cpu"))
    calibration = dm.unlabeled_images(settings.calibration_images, setup.correction.batch_size)
    correction = Correction(replace(setup.correction, enabled=True, num_samples=settings.calibration_images), calibration)
    data_s = time.perf_counter() - started
    val_images = sum(len(b[1]) for b in data.val)
    log(f"data: {settings.knn_train}/{val_images} evaluation images, "
        f"{len(calibration)} calibration images ({data_s:.1f}s)")

    def evaluate(m: torch.nn.Module) -> dict[str, Any]:
        t0 = time.perf_counter()
        return {**{k: v for k, v in evaluation(m).items() if k in dict(REPORTED)}, "eval_s": time.perf_counter() - t0}

    dense = {"params": sum(p.numel() for p in model.parameters()), **evaluate(model)}
    log("dense: " + _metrics_text(dense))
    rows = []
    with tempfile.TemporaryDirectory(prefix="correction_finetune_") as tmp:
        teacher = Path(tmp) / "dense.safetensors"
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(teacher))
        budgets = [Budget.parse(b) for b in settings.budgets] if settings.budgets is not None else setup.export.budgets
        if setup.export.split == "fitness":  # as prune.py's export: each cost budget's head/MLP split by the fitness
            images = dm.unlabeled_images(setup.search.num_images, setup.search.batch_size)
            choices = choose_splits(model, images, elastic, budgets, setup.search, replace(setup.export, split_grid=0))
            elastic.splits = split_table(choices)
        for one in budgets:
            label, budget = one.label(), [one]
            started = time.perf_counter()
            (pruned,) = extract_models(model, elastic, budget, keep_models=True)
            row: dict[str, Any] = {"budget": label, "mlp_ratio": pruned.mlp_ratio, "head_ratio": pruned.head_ratio,
                                   "heads": pruned.subnet.head_counts, "mlp_hidden": pruned.subnet.neuron_counts,
                                   "params": pruned.params, "flops": pruned.flops}
            row["pruned"] = {"prune_s": time.perf_counter() - started, **evaluate(pruned.model)}
            log(f"{label} (a) pruned: {_metrics_text(row['pruned'])}")

            (corrected,) = extract_models(model, elastic, budget, correction=correction, keep_models=True)
            row["corrected"] = {"correction_s": corrected.correction["seconds"], **evaluate(corrected.model)}
            log(f"{label} (b) corrected in {row['corrected']['correction_s']:.1f}s: {_metrics_text(row['corrected'])}")

            workdir = Path(tmp) / pruned.label
            tuned, info = finetune(corrected.model, corrected.subnet, setup, teacher, workdir, settings)
            row["finetuned"] = {**info, **evaluate(tuned)}
            log(f"{label} (c) fine-tuned {info['steps']} steps in {info['finetune_s']:.1f}s: {_metrics_text(row['finetuned'])}")
            rows.append(row)

    report = {
        "benchmark": "benchmarks/correction_finetune.py", "quick": quick, "name": out_prefix.name,
        "model": {"source": display(MODELS[model_name]), **setup.spec.to_dict()}, "scores": scores_info,
        "settings": asdict(settings), "machine": machine_info(), "data_s": data_s, "val_images": val_images, "dense": dense, "models": rows,
        "total_s": time.perf_counter() - log.start,
    }
    write_results(out_prefix, report, markdown, settings)
    log(f"wrote {display(out_prefix.with_suffix('.md'))} and .json (total {report['total_s']:.1f}s)")
    return report


def _metrics_text(result: dict[str, Any]) -> str:
    values = ", ".join(f"{name} {pct(result.get(key))}" for key, name in REPORTED)
    return f"{values} (eval {result['eval_s']:.1f}s)"


def markdown(report: dict[str, Any]) -> str:
    s, dense, model = report["settings"], report["dense"], report["model"]
    finetune_what = (f"{s['finetune_steps']} steps" if s["finetune_steps"]
                     else f"1 epoch over {s['finetune_samples'] or 'all'} train images")
    lines = ["# Weight correction and short fine-tuning after pruning", ""]
    if "warning" in model:
        lines += [f"> **WARNING:** {model['warning']}.", ""]
    lines += [
        f"`python benchmarks/correction_finetune.py{' --quick' if report['quick'] else ''}`, {report['machine']['date']}, "
        f"{report['machine']['cpu']} ({report['machine']['torch_threads']} torch thread{'s' if report['machine']['torch_threads'] != 1 else ''}), total "
        f"{report['total_s'] / 60:.1f} min. Raw numbers: `{report['name']}.json`.",
        "",
        f"Model: {model['model_name']} from {model['source']}, {dense['params'] / 1e6:.3f}M params. "
        f"Scores: {report['scores']['source']}. Fashion-MNIST top-1 (%) on {report['val_images']} test images; k-NN "
        f"(k={s['knn_k']}) and linear probe on {s['knn_train']} train images. (a) pruned, no retraining; "
        f"(b) `correct_and_prune` on {s['calibration_images']} calibration images; (c) (b) fine-tuned with "
        f"`FinetuneModule(loss=both, distill=kl)` for {finetune_what} (batch {s['finetune_batch']}, AdamW lr "
        f"{s['lr']}, {int(100 * s['warmup_fraction'])}% warm-up then cosine).",
        "",
        f"Dense: k-NN {pct(dense['knn_top1'])}, linear {pct(dense['linear_top1'])}, own head {pct(dense['head_top1'])}.",
        "",
        "| budget | (mlp, head) ratios | params | " + " | ".join(f"{name} a / b / c" for _, name in REPORTED)
        + " | correction s | fine-tune s (steps) |",
        "|---|---|---|" + "---:|" * len(REPORTED) + "---:|---:|",  # budget, ratios, params, metrics, seconds
    ]
    for row in report["models"]:
        cells = [" / ".join(pct(row[stage].get(key)) for stage, _ in STAGES) for key, _ in REPORTED]
        lines.append(f"| {row['budget']} | ({row['mlp_ratio']:.2f}, {row['head_ratio']:.2f}) | {row['params'] / dense['params']:.0%} | "
                     + " | ".join(cells)
                     + f" | {row['corrected']['correction_s']:.1f} | {row['finetuned']['finetune_s']:.1f} "
                       f"({row['finetuned']['steps']}) |")
    evals = [row[stage]["eval_s"] for row in report["models"] for stage, _ in STAGES] + [dense["eval_s"]]
    lines += [
        "",
        f"Wall time: scores {report['scores']['seconds']:.1f}s, evaluation data {report['data_s']:.1f}s, "
        f"{len(evals)} evaluations {sum(evals):.1f}s (k-NN + linear probe + head), corrections "
        f"{sum(r['corrected']['correction_s'] for r in report['models']):.1f}s, fine-tunes "
        f"{sum(r['finetuned']['finetune_s'] for r in report['models']):.1f}s.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scores", default=None,
                        help="a prune run directory or its elastic_scores.safetensors (default: SSL-Fisher local scores)")
    parser.add_argument("--model", default="reference", help=f"a development model: {', '.join(MODELS)}")
    parser.add_argument("--quick", action="store_true", help="2 budgets, tiny sizes: checks that everything runs")
    parser.add_argument("--finetune-steps", type=int, default=None, help="optimizer steps instead of one epoch")
    parser.add_argument("--finetune-samples", type=int, default=None,
                        help="train images of the one fine-tuning epoch (default 10000; 0: the whole split)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: most ops here are tiny, and on a shared 2-core machine "
                             "2 threads measured up to 30x slower; 0: torch's default)")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/correction_finetune[_quick])")
    args = parse_args(parser, argv)
    settings = Settings().quick() if args.quick else Settings()
    if args.finetune_steps is not None:
        settings = replace(settings, finetune_steps=args.finetune_steps)
    if args.finetune_samples is not None:
        settings = replace(settings, finetune_samples=args.finetune_samples or None)
    out = Path(args.out) if args.out else RESULTS / ("correction_finetune_quick" if args.quick else "correction_finetune")
    try:
        run(settings, args.scores, args.model, out, args.quick, args.threads or None)
    except SnapViTError as err:  # e.g. scores of another model: one line, not a traceback
        return exit_with_error(err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
