"""What weight correction and a short fine-tune add to a retraining-free pruned ViT. Not run in CI.

For each of the paper's (mlp_ratio, head_ratio) pairs, one model is cut from the elastic scores and
measured three times:

  (a) pruned:     the cut alone (``prune_``), no retraining;
  (b) corrected:  ``correct_and_prune`` (SparseGPT-style OBS update of ``attn.proj`` / ``mlp.fc2``) on
                  calibration images (default 256, as ``CorrectionCallback``);
  (c) fine-tuned: (b) trained briefly with ``FinetuneModule`` (``loss: both`` = cross-entropy on labels
                  + KL distillation from the dense model) under a lightweight Trainer: one epoch over
                  ``--finetune-samples`` train images, or ``--finetune-steps N`` optimizer steps.

Each gets weighted k-NN, linear-probe and own-head top-1 (``snapvit_pl.eval.suite.evaluate_classification``
on a seeded class-balanced train/val subset), and every step is timed.

    python benchmarks/correction_finetune.py [--scores runs/prune/X] [--checkpoint assets/reference_vit_fmnist]
    python benchmarks/correction_finetune.py --quick       # smoke run: 2 pairs, tiny sizes (~20 s)

Full run: about 13 minutes on 2 CPU cores (1 torch thread; estimated from the quick run and timed
samples of each stage): 19 evaluations of ~25 s (feature extraction of 12000 images dominates),
six fine-tunes of 79 steps (~35 s each), SSL-Fisher scores ~1 min, corrections ~2 s each.

Model: the reference ViT (pruned-checkpoint format) if present, else the demo config's architecture with
RANDOM weights (the report says so). Scores: ``elastic_scores.safetensors`` of a prune run (``--scores``
takes the run directory or the file); without it, SSL-Fisher local scores on 1000 train images
(multi-crop, as prune.py) with the initial block coefficients, i.e. no search.
Writes ``benchmarks/results/correction_finetune.{md,json}`` (``--quick``: ``correction_finetune_quick.*``).
"""
from __future__ import annotations

import argparse
import copy
import logging
import os
import platform
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # callbacks/ and snapvit_pl when run as a script

from callbacks.export import PAPER_BUDGETS  # noqa: E402
from snapvit_pl.correction import correct_and_prune  # noqa: E402
from snapvit_pl.data import ClassificationDataModule  # noqa: E402
from snapvit_pl.elastic import Budget, CostModel, ElasticScores, initial_coefficients  # noqa: E402
from snapvit_pl.errors import SnapViTError  # noqa: E402
from snapvit_pl.eval.suite import evaluate_classification  # noqa: E402
from snapvit_pl.evaluate import build_data  # noqa: E402
from snapvit_pl.io import write_json_atomic, write_text_atomic  # noqa: E402
from snapvit_pl.models import (  # noqa: E402
    BackboneSpec, count_flops, count_params, fingerprint, load_backbone, load_pruned, prune_, save_pruned,
)
from snapvit_pl.scoring import build_scorer  # noqa: E402

DEMO_CONFIG = ROOT / "configs" / "prune" / "demo.yaml"
REFERENCE = ROOT / "assets" / "reference_vit_fmnist"
RESULTS = ROOT / "benchmarks" / "results"
PAIRS = [(b["mlp_ratio"], b["head_ratio"]) for b in PAPER_BUDGETS]
METRICS = ("knn", "linear", "head")
REPORTED = (("knn_top1", "k-NN"), ("linear_top1", "linear probe"), ("head_top1", "own head"))
STAGES = (("pruned", "(a) pruned"), ("corrected", "(b) corrected"), ("finetuned", "(c) fine-tuned"))


@dataclass
class Settings:
    pairs: list[tuple[float, float]] = field(default_factory=lambda: list(PAIRS))
    scoring_images: int = 1000       # only when no --scores: SSL-Fisher local scores
    scoring_batch: int = 16
    calibration_images: int = 256
    correction_batch: int = 64
    finetune_samples: Optional[int] = 10000  # one epoch over this seeded train subset (None: the whole split)
    finetune_steps: Optional[int] = None     # instead: exactly this many optimizer steps
    finetune_batch: int = 128
    lr: float = 5e-4
    warmup_fraction: float = 0.1
    distill_weight: float = 1.0
    temperature: float = 1.0
    knn_train: int = 10000
    knn_val: int = 2000
    knn_k: int = 20
    eval_batch: int = 256
    seed: int = 0

    def quick(self) -> "Settings":
        return replace(self, pairs=[PAIRS[2], PAIRS[5]], scoring_images=48, calibration_images=32,
                       finetune_samples=320, finetune_batch=32, knn_train=300, knn_val=100, knn_k=10)


def log(message: str, _start=[time.perf_counter()]) -> None:  # noqa: B006 (the run's start time)
    print(f"[{time.perf_counter() - _start[0]:7.1f}s] {message}", flush=True)


def load_reference(path: Path) -> tuple[torch.nn.Module, BackboneSpec, dict[str, Any]]:
    """The reference ViT (pruned-checkpoint format), else the demo config's architecture with random weights."""
    if (path / "architecture.json").is_file():
        model, record = load_pruned(path)
        return model.eval(), BackboneSpec.from_dict(record["base"]), {"source": _display(path), "reference": True}
    demo = yaml.safe_load(DEMO_CONFIG.read_text())["model"]
    spec = BackboneSpec(demo["model_name"], False, None, dict(demo.get("model_kwargs") or {}))
    torch.manual_seed(0)
    warning = (f"{_display(path)} not found: the demo config's architecture with RANDOM weights; the accuracies "
               "show that the pipeline runs, not what correction or fine-tuning recover on a trained model")
    return load_backbone(spec).eval(), spec, {"source": "configs/prune/demo.yaml (random weights)", "reference": False,
                                              "warning": warning}


def _display(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def elastic_scores(scores: Optional[str], model: torch.nn.Module, spec: BackboneSpec, dm: ClassificationDataModule,
                   settings: Settings) -> tuple[ElasticScores, dict[str, Any]]:
    """``--scores`` (a prune run directory or its elastic_scores.safetensors), else SSL-Fisher local scores."""
    started = time.perf_counter()
    if scores is not None:
        path = Path(scores)
        path = path / "elastic_scores.safetensors" if path.is_dir() else path
        loaded = ElasticScores.load(path)
        loaded.check_model(model)  # same architecture and weights, or a clear error
        searched = loaded.coefficients is not None
        if not searched:
            loaded.coefficients = initial_coefficients(len(loaded.head_scores), loaded.heads_per_block)
        return loaded, {"source": _display(path), "searched": searched, "seconds": time.perf_counter() - started,
                        "evaluations": loaded.search.get("evaluations")}
    scorer = build_scorer("ssl_fisher", n_global=2, reduction="squared_sum")  # configs/prune/demo.yaml's scorer
    scorer.setup(model)
    for batch in dm.unlabeled_dataloader(views="multicrop", batch_size=settings.scoring_batch,
                                         max_samples=settings.scoring_images):
        scorer.update(batch)
    scorer.reduce(lambda t: t)
    local = scorer.compute()
    model.eval()
    blocks = len(local.heads)
    heads_per_block = [len(h) for h in local.heads]
    result = ElasticScores(local.heads, local.neurons, initial_coefficients(blocks, heads_per_block), spec.to_dict(),
                           fingerprint(model))
    return result, {"source": f"computed: ssl_fisher local scores on {settings.scoring_images} train images, "
                              "initial coefficients (no search)", "searched": False,
                    "seconds": time.perf_counter() - started}


def evaluate(model: torch.nn.Module, data, settings: Settings) -> dict[str, Any]:
    started = time.perf_counter()
    metrics = evaluate_classification(model, data.train, data.val, METRICS, knn_k=settings.knn_k, device="cpu")
    return {**{k: metrics.get(k) for k, _ in REPORTED}, "eval_s": time.perf_counter() - started}


def finetune(model: torch.nn.Module, subnet, spec: BackboneSpec, teacher_path: Path, workdir: Path,
             settings: Settings) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(c): FinetuneModule(loss=both, distill=kl) on a pruned-checkpoint copy of ``model``, one short fit."""
    import pytorch_lightning as pl

    from snapvit_pl.lightning.finetune_module import FinetuneModule

    checkpoint = save_pruned(model, workdir / "start", spec, subnet)
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
            "final_loss": float(metrics["train/loss"]) if "train/loss" in metrics else None,
            "final_ce": float(metrics["train/ce"]) if "train/ce" in metrics else None,
            "final_distill": float(metrics["train/distill"]) if "train/distill" in metrics else None}
    return module.model.eval(), info


def run(settings: Settings, scores: Optional[str], checkpoint: Path, out_prefix: Path, quick: bool,
        threads: Optional[int]) -> dict[str, Any]:
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # no "GPU available" banner per fine-tune
    for message in (".*module\\(s\\) in eval mode", ".*isinstance.treespec, LeafSpec.*"):  # the frozen teacher; a pytree deprecation
        warnings.filterwarnings("ignore", message=message)
    if threads:
        torch.set_num_threads(threads)
    total_started = time.perf_counter()
    model, spec, model_info = load_reference(checkpoint)
    log(f"model: {model_info['source']}" + (f"\n  WARNING: {model_info['warning']}" if "warning" in model_info else ""))
    dm = ClassificationDataModule(source="fashion_mnist", seed=settings.seed)
    dm.configure_for_model(model)
    elastic, scores_info = elastic_scores(scores, model, spec, dm, settings)
    log(f"scores: {scores_info['source']} ({scores_info['seconds']:.1f}s)")

    started = time.perf_counter()
    data = build_data(model, METRICS, "fashion_mnist", "data", settings.knn_train, settings.knn_val, settings.eval_batch,
                      seed=settings.seed, cache=True)
    calibration = dm.unlabeled_images(settings.calibration_images, settings.correction_batch)
    data_s = time.perf_counter() - started
    log(f"data: {settings.knn_train}/{settings.knn_val} evaluation images, {len(calibration)} calibration images ({data_s:.1f}s)")

    dense = {"params": count_params(model), "flops": count_flops(model), **evaluate(model, data, settings)}
    log("dense: " + _metrics_text(dense))
    cost = CostModel(model)
    rows = []
    with tempfile.TemporaryDirectory(prefix="correction_finetune_") as tmp:
        teacher = Path(tmp) / "dense.safetensors"
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(teacher))
        for mlp_ratio, head_ratio in settings.pairs:
            label = f"({mlp_ratio:.2f}, {head_ratio:.2f})"
            subnet, _, _ = elastic.subnet(Budget(mlp_ratio=mlp_ratio, head_ratio=head_ratio), cost)
            row: dict[str, Any] = {"mlp_ratio": mlp_ratio, "head_ratio": head_ratio, "heads": subnet.head_counts,
                                   "mlp_hidden": subnet.neuron_counts}

            started = time.perf_counter()
            pruned = prune_(copy.deepcopy(model), subnet)
            row["params"], row["flops"] = count_params(pruned), count_flops(pruned)
            row["pruned"] = {"prune_s": time.perf_counter() - started, **evaluate(pruned, data, settings)}
            log(f"{label} (a) pruned: {_metrics_text(row['pruned'])}")
            del pruned

            started = time.perf_counter()
            corrected = correct_and_prune(copy.deepcopy(model), subnet, calibration, batch_size=settings.correction_batch)
            row["corrected"] = {"correction_s": time.perf_counter() - started, **evaluate(corrected, data, settings)}
            log(f"{label} (b) corrected in {row['corrected']['correction_s']:.1f}s: {_metrics_text(row['corrected'])}")

            workdir = Path(tmp) / f"mlp{mlp_ratio:.2f}_head{head_ratio:.2f}"
            tuned, info = finetune(corrected, subnet, spec, teacher, workdir, settings)
            row["finetuned"] = {**info, **evaluate(tuned, data, settings)}
            log(f"{label} (c) fine-tuned {info['steps']} steps in {info['finetune_s']:.1f}s: {_metrics_text(row['finetuned'])}")
            rows.append(row)
            del corrected, tuned

    report = {
        "benchmark": "benchmarks/correction_finetune.py", "quick": quick, "name": out_prefix.name,
        "model": {**model_info, **spec.to_dict()}, "scores": scores_info, "settings": asdict(settings),
        "machine": machine_info(), "data_s": data_s, "dense": dense, "pairs": rows,
        "total_s": time.perf_counter() - total_started,
    }
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_prefix.with_suffix(".json"), _rounded(report))
    write_text_atomic(out_prefix.with_suffix(".md"), markdown(report))
    log(f"wrote {_display(out_prefix.with_suffix('.md'))} and .json (total {report['total_s']:.1f}s)")
    return report


def _metrics_text(result: dict[str, Any]) -> str:
    values = ", ".join(f"{name} {pct(result.get(key))}" for key, name in REPORTED)
    return f"{values} (eval {result['eval_s']:.1f}s)"


def pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def machine_info() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "load_average_1m_at_end": load[0] if load else None,
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M")}


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
        f"Scores: {report['scores']['source']}. Fashion-MNIST top-1 (%) on {s['knn_val']} val images; k-NN "
        f"(k={s['knn_k']}) and linear probe on {s['knn_train']} train images. (a) pruned, no retraining; "
        f"(b) `correct_and_prune` on {s['calibration_images']} calibration images; (c) (b) fine-tuned with "
        f"`FinetuneModule(loss=both, distill=kl)` for {finetune_what} (batch {s['finetune_batch']}, AdamW lr "
        f"{s['lr']}, {int(100 * s['warmup_fraction'])}% warm-up then cosine).",
        "",
        f"Dense: k-NN {pct(dense['knn_top1'])}, linear {pct(dense['linear_top1'])}, own head {pct(dense['head_top1'])}.",
        "",
        "| (mlp, head) | params | " + " | ".join(f"{name} a / b / c" for _, name in REPORTED)
        + " | correction s | fine-tune s (steps) |",
        "|---|---|" + "---|" * len(REPORTED) + "---|---|",
    ]
    for row in report["pairs"]:
        cells = [" / ".join(pct(row[stage].get(key)) for stage, _ in STAGES) for key, _ in REPORTED]
        lines.append(f"| ({row['mlp_ratio']:.2f}, {row['head_ratio']:.2f}) | {row['params'] / 1e6:.3f}M | "
                     + " | ".join(cells)
                     + f" | {row['corrected']['correction_s']:.1f} | {row['finetuned']['finetune_s']:.1f} "
                       f"({row['finetuned']['steps']}) |")
    evals = [row[stage]["eval_s"] for row in report["pairs"] for stage, _ in STAGES] + [dense["eval_s"]]
    lines += [
        "",
        f"Wall time: scores {report['scores']['seconds']:.1f}s, evaluation data {report['data_s']:.1f}s, "
        f"{len(evals)} evaluations {sum(evals):.1f}s (k-NN + linear probe + head), corrections "
        f"{sum(r['corrected']['correction_s'] for r in report['pairs']):.1f}s, fine-tunes "
        f"{sum(r['finetuned']['finetune_s'] for r in report['pairs']):.1f}s.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scores", default=None,
                        help="a prune run directory or its elastic_scores.safetensors (default: SSL-Fisher local scores)")
    parser.add_argument("--checkpoint", default=str(REFERENCE), help="the dense model, pruned-checkpoint format")
    parser.add_argument("--quick", action="store_true", help="2 pairs, tiny sizes: checks that everything runs")
    parser.add_argument("--finetune-steps", type=int, default=None, help="optimizer steps instead of one epoch")
    parser.add_argument("--finetune-samples", type=int, default=None,
                        help="train images of the one fine-tuning epoch (default 10000; 0: the whole split)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: most ops here are tiny, and on a shared 2-core machine "
                             "2 threads measured up to 30x slower; 0: torch's default)")
    parser.add_argument("--out", default=None, help="output prefix (default benchmarks/results/correction_finetune[_quick])")
    args = parser.parse_args(argv)
    settings = Settings().quick() if args.quick else Settings()
    if args.finetune_steps is not None:
        settings = replace(settings, finetune_steps=args.finetune_steps)
    if args.finetune_samples is not None:
        settings = replace(settings, finetune_samples=args.finetune_samples or None)
    out = Path(args.out) if args.out else RESULTS / ("correction_finetune_quick" if args.quick else "correction_finetune")
    try:
        run(settings, args.scores, Path(args.checkpoint), out, args.quick, args.threads or None)
    except SnapViTError as err:  # e.g. scores of another model: one line, not a traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
