"""Pruned checkpoints on the Hugging Face Hub: load them by ``hf-hub:org/name``, publish them with a model card.

    from snapvit_pl.models import load_pruned
    model, record = load_pruned("hf-hub:org/vit-s-dino-pruned-50")      # downloads, or the offline cache

    python -m snapvit_pl.hub push --checkpoint runs/prune/X/models/sparsity0.5 --repo org/vit-s-dino-pruned-50

A pushed repository holds ``model.safetensors``, ``architecture.json`` (rebuilt from timm, no pickles)
and a ``README.md`` model card (base model, budget, kept heads and MLP width per block, parameters,
FLOPs, the metrics the run measured) with ``library_name: snapvit-pl`` and tags the Hub understands.
Downloads go through ``huggingface_hub`` and honour its cache and ``HF_HUB_OFFLINE``.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

from .errors import CheckpointError, ConfigError, SnapViTError, exit_with_error
from .models.loading import HUB_PREFIX

FILES = ("model.safetensors", "architecture.json")


def hub_repo(name: str) -> Optional[str]:
    """``"hf-hub:org/name"`` -> ``"org/name"`` (with an optional ``@revision``); None for anything else."""
    return name[len(HUB_PREFIX):] if isinstance(name, str) and name.startswith(HUB_PREFIX) else None


def download_pruned(name: str) -> Path:
    """The local directory of the pruned checkpoint ``hf-hub:org/name[@revision]`` (downloaded, or from the cache).

    Raises:
        CheckpointError: not on the Hub (or not in the offline cache), or not a snapvit-pl checkpoint.
    """
    from huggingface_hub import snapshot_download

    repo = hub_repo(name)
    repo_id, _, revision = repo.partition("@")
    try:
        folder = snapshot_download(repo_id, revision=revision or None, allow_patterns=list(FILES) + ["README.md"])
    except Exception as err:  # huggingface_hub raises many types (offline, not found, gated, HTTP)
        raise CheckpointError(
            f"could not fetch {name} ({type(err).__name__}: {' '.join(str(err).split())[:200]}); check the repository "
            "name, your network or login, or with HF_HUB_OFFLINE=1 that it is in the local Hugging Face cache"
        ) from err
    missing = [f for f in FILES if not (Path(folder) / f).is_file()]
    if missing:
        raise CheckpointError(f"{name} is not a snapvit-pl pruned checkpoint (no {', '.join(missing)})")
    return Path(folder)


def model_card(record: dict[str, Any], repo_id: str) -> str:
    """A ``README.md`` for a pruned checkpoint: YAML metadata for the Hub, then what was cut and measured."""
    base = record["base"]
    extra = record.get("extra") or {}
    base_name = (extra.get("base_spec") or {}).get("model_name") or base["model_name"]
    hub_base = base_name[len(HUB_PREFIX):] if base_name.startswith(HUB_PREFIX) else f"timm/{base_name}"
    heads, widths = record["heads"], record["mlp_hidden"]
    metrics = extra.get("metrics") or {}
    lines = [
        "---",
        "library_name: snapvit-pl",
        "tags:", "- image-classification", "- timm", "- vision-transformer", "- pruning", "- snapvit",
        f"base_model: {hub_base}",
        "license: apache-2.0",
        "---", "",
        f"# {repo_id.split('/')[-1]}",
        "",
        f"A structurally pruned copy of `{base_name}`, cut by snapvit-pl (SnapViT: elastic "
        "ViTs from pretrained models without retraining). Whole attention heads and MLP neurons were removed; "
        "it is a plain timm model.",
        "",
        "| | |", "|---|---|",
        f"| base model | `{base_name}` |",
    ]
    if extra.get("budget"):
        lines.append(f"| budget | `{json.dumps(extra['budget'])}` |")
    if "mlp_ratio" in extra:
        lines.append(f"| removed | {100 * extra['mlp_ratio']:.1f}% of the MLP neurons, {100 * extra['head_ratio']:.1f}% of the heads |")
    for key, label in (("params", "parameters"), ("flops", "FLOPs per image")):
        if key in extra:
            lines.append(f"| {label} | {extra[key]:,} |")
    lines += ["", "Kept per block:", "", "| block | " + " | ".join(str(b) for b in range(len(heads))) + " |",
              "|---|" + "---|" * len(heads),
              "| heads | " + " | ".join(str(h) for h in heads) + " |",
              "| MLP width | " + " | ".join(str(w) for w in widths) + " |"]
    shown = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    if shown:
        lines += ["", "Measured by the run that cut it (fractions for accuracies):", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" for k, v in sorted(shown.items())]
    lines += ["", "## Use", "", "```python", "from snapvit_pl.models import load_pruned", "",
              f'model, record = load_pruned("hf-hub:{repo_id}")   # timm + safetensors, no pickles', "```", ""]
    return "\n".join(lines)


def push_to_hub(checkpoint: str | Path, repo_id: str, *, private: bool = False, token: Optional[str] = None,
                commit_message: Optional[str] = None, api: Any = None) -> str:
    """Upload a pruned checkpoint directory and a generated model card to ``repo_id``; returns the repo URL.

    Args:
        checkpoint: a directory written by ``prune.py`` / ``save_pruned`` (checked by loading its record).
        repo_id: ``org/name`` on the Hub (created if missing).
        private: create the repository private.
        token: a Hub token (default: the logged-in one).
        commit_message: default ``"snapvit-pl pruned checkpoint"``.
        api: a ``huggingface_hub.HfApi`` (tests pass a stand-in).
    """
    from huggingface_hub import HfApi

    from .models.checkpoint import read_record

    checkpoint = Path(checkpoint)
    record = read_record(checkpoint)
    if not (checkpoint / FILES[0]).is_file():
        raise CheckpointError(f"{checkpoint / FILES[0]} not found; push a complete pruned checkpoint directory")
    api = api or HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="snapvit-push-") as staging:
        for name in FILES:
            (Path(staging) / name).write_bytes((checkpoint / name).read_bytes())
        (Path(staging) / "README.md").write_text(model_card(record, repo_id))
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(folder_path=staging, repo_id=repo_id, commit_message=commit_message or "snapvit-pl pruned checkpoint")
    return str(url)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m snapvit_pl.hub push|card``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m snapvit_pl.hub", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    push = commands.add_parser("push", help="upload a pruned checkpoint with a generated model card")
    card = commands.add_parser("card", help="print the model card push would upload (no network)")
    for sub in (push, card):
        sub.add_argument("--checkpoint", required=True, help="pruned checkpoint directory (prune.py's models/<budget>)")
        sub.add_argument("--repo", required=True, help="org/name on the Hugging Face Hub")
        sub.add_argument("--verbose", action="store_true", help="show the traceback of errors")
    push.add_argument("--private", action="store_true", help="create the repository private")
    push.add_argument("--token", default=None, help="a Hub token (default: the logged-in one)")
    args = parser.parse_args(argv)
    try:
        if "/" not in args.repo:
            raise ConfigError(f"--repo {args.repo!r} must be org/name (your user name or an organisation, then the model)")
        if args.command == "card":
            from .models.checkpoint import read_record

            print(model_card(read_record(args.checkpoint), args.repo))
            return 0
        try:
            url = push_to_hub(args.checkpoint, args.repo, private=args.private, token=args.token)
        except SnapViTError:
            raise
        except Exception as err:  # network, authentication, permissions
            raise ConfigError(f"the upload to {args.repo} failed ({type(err).__name__}: {' '.join(str(err).split())[:200]}); "
                              "check your network and `huggingface-cli login`") from err
    except SnapViTError as err:
        return exit_with_error(err, args.verbose)
    print(f"pushed {args.checkpoint} to {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
