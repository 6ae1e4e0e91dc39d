"""Publishing pruned checkpoints on the Hugging Face Hub, with a model card written by ``huggingface_hub``.

    from snapvit_pl.models.publish import push_to_hub
    push_to_hub("runs/prune/X/models/sparsity0.5", "org/vit-s-dino-pruned-50")

The card's metadata (``ModelCardData``) takes the license and the pipeline tag from the base model (timm's
pretrained config; ``image-feature-extraction`` for a model without a classifier, such as DINO), and the
metrics the pruning run measured as ``model-index`` evaluation results.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Optional

from ..ranges import PositiveFloat, check_value
from .checkpoint import verify_checkpoint
from .hub import CHECKPOINT_FILES
from .loading import HTTP_TIMEOUT, HUB_PREFIX, http_timeout

#: Licenses the Hub knows by these ids; any other (e.g. ``dinov3-license``) is written as ``other`` plus its name.
HUB_LICENSES = ("apache-2.0", "mit", "bsd-3-clause", "bsd-2-clause", "cc-by-4.0", "cc-by-sa-4.0", "cc-by-nc-4.0",
                "cc-by-nc-sa-4.0", "cc-by-nc-nd-4.0", "cc0-1.0", "gpl-3.0", "lgpl-3.0", "openrail", "llama2", "llama3")
#: Metric keys of a run's evaluation -> (task, model-index metric type, readable name).
EVAL_METRICS = {
    "knn_top1": ("image-classification", "accuracy", "weighted k-NN top-1"),
    "knn_top5": ("image-classification", "accuracy", "weighted k-NN top-5"),
    "linear_top1": ("image-classification", "accuracy", "linear-probe top-1"),
    "head_top1": ("image-classification", "accuracy", "own-head top-1 (no retraining)"),
    "seg_miou": ("image-segmentation", "mean_iou", "linear-probe mIoU"),
}


def base_model_info(record: dict[str, Any]) -> dict[str, Any]:
    """What the card says of the base model: its name, Hub id, license and whether it has a classifier."""
    extra = record.get("extra") or {}
    base_spec = extra.get("base_spec") or record["base"]
    name = base_spec.get("model_name") or record["base"]["model_name"]
    hub_id = name[len(HUB_PREFIX):] if name.startswith(HUB_PREFIX) else f"timm/{name}"
    cfg: dict[str, Any] = {}
    try:
        if name.startswith(HUB_PREFIX):
            from timm.models._hub import load_model_config_from_hf

            cfg = load_model_config_from_hf(name[len(HUB_PREFIX):])[0]
        else:
            import timm

            found = timm.models.get_pretrained_cfg(name)
            cfg = found.to_dict() if found is not None else {}
    except Exception:  # no network, no cache, not a timm name: the card says less
        cfg = {}
    classes = (base_spec.get("model_kwargs") or {}).get("num_classes", cfg.get("num_classes"))
    return {"name": name, "hub_id": hub_id, "license": cfg.get("license"), "has_head": bool(classes)}


def model_card(record: dict[str, Any], repo_id: str) -> str:
    """A ``README.md`` for a pruned checkpoint: the Hub's metadata, then what was cut and measured."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    base = base_model_info(record)
    extra = record.get("extra") or {}
    heads, widths = record["heads"], record["mlp_hidden"]
    name = repo_id.split("/")[-1]
    license_fields: dict[str, Any] = {}
    if base["license"] in HUB_LICENSES:
        license_fields["license"] = base["license"]
    elif base["license"]:
        license_fields.update(license="other", license_name=base["license"])
    evaluated = extra.get("evaluated_on") or {}
    results = [
        EvalResult(task_type=task, dataset_type=evaluated["dataset"], dataset_name=evaluated["dataset"],
                   dataset_split=evaluated.get("split"), metric_type=kind, metric_value=round(float(value), 4),
                   metric_name=label)
        for key, (task, kind, label) in EVAL_METRICS.items()
        if isinstance((value := (extra.get("metrics") or {}).get(key)), (int, float)) and evaluated.get("dataset")
    ]
    data = ModelCardData(
        library_name="snapvit-pl", base_model=base["hub_id"], model_name=name,
        pipeline_tag="image-classification" if base["has_head"] else "image-feature-extraction",
        tags=["snapvit-pl", "pruned", "vision-transformer", "timm"], eval_results=results or None, **license_fields,
    )
    lines = [
        f"# {name}", "",
        f"A structurally pruned copy of `{base['name']}`, cut by snapvit-pl (SnapViT: elastic ViTs from pretrained "
        "models without retraining). Whole attention heads and MLP neurons were removed; it is a plain timm model.",
        "", "| | |", "|---|---|", f"| base model | `{base['name']}` |",
    ]
    if extra.get("budget"):
        lines.append(f"| budget | `{json.dumps(extra['budget'])}` |")
    if extra.get("mlp_ratio") is not None and extra.get("head_ratio") is not None:
        lines.append(f"| removed | {100 * extra['mlp_ratio']:.1f}% of the MLP neurons, {100 * extra['head_ratio']:.1f}% "
                     "of the heads |")
    for key, label in (("params", "parameters"), ("flops", "FLOPs per image (2 per multiply-accumulate)"),
                       ("macs", "multiply-accumulates per image (what papers call FLOPs)")):
        if extra.get(key) is not None:
            lines.append(f"| {label} | {extra[key]:,} |")
    lines += ["", "Kept per block:", "", "| block | " + " | ".join(str(b) for b in range(len(heads))) + " |",
              "|---|" + "---|" * len(heads),
              "| heads | " + " | ".join(str(h) for h in heads) + " |",
              "| MLP width | " + " | ".join(str(w) for w in widths) + " |"]
    shown = {k: v for k, v in (extra.get("metrics") or {}).items() if isinstance(v, (int, float))}
    if shown:
        where = f" on {evaluated['dataset']}" if evaluated.get("dataset") else ""
        lines += ["", f"Measured by the run that cut it{where} (fractions for accuracies):", "", "| metric | value |",
                  "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" for k, v in sorted(shown.items())]
    lines += ["", "## Use", "", "```python", "from snapvit_pl.models import load_pruned", "",
              f'model, record = load_pruned("hf-hub:{repo_id}")   # timm + safetensors, no pickles', "```", ""]
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)))


def push_to_hub(checkpoint: str | Path, repo_id: str, *, private: bool = False, token: Optional[str] = None,
                commit_message: Optional[str] = None, api: Any = None, timeout: PositiveFloat = HTTP_TIMEOUT) -> str:
    """Upload a pruned checkpoint directory and a generated model card to ``repo_id``; returns the repo URL.

    Args:
        checkpoint: a directory written by ``prune.py`` / ``save_pruned`` (checked by loading its record).
        repo_id: ``org/name`` on the Hub (created if missing).
        private: create the repository private.
        token: a Hub token (default: the logged-in one).
        commit_message: default ``"snapvit-pl pruned checkpoint"``.
        api: a ``huggingface_hub.HfApi`` (tests pass a stand-in).
        timeout: seconds each connection, read and write of a request may wait (a Hub that stops answering ends the
            push with an error instead of holding it for ever).
    """
    from huggingface_hub import HfApi

    check_value("--timeout", timeout, PositiveFloat)
    checkpoint = Path(checkpoint)
    record = verify_checkpoint(checkpoint)  # never upload damaged weights
    api = api or HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="snapvit-push-") as staging:
        for name in CHECKPOINT_FILES:
            (Path(staging) / name).write_bytes((checkpoint / name).read_bytes())
        (Path(staging) / "README.md").write_text(model_card(record, repo_id))
        with http_timeout(timeout):
            url = api.create_repo(repo_id, private=private, exist_ok=True)
            api.upload_folder(folder_path=staging, repo_id=repo_id,
                              commit_message=commit_message or "snapvit-pl pruned checkpoint")
    return str(url)
