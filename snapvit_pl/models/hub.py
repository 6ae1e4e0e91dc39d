"""Pruned checkpoints on the Hugging Face Hub, read side: ``hf-hub:org/name[@revision]`` to a local directory.

Downloads go through ``huggingface_hub``, which honours its cache and ``HF_HUB_OFFLINE``. Publishing
(:func:`snapvit_pl.hub.push_to_hub`) lives with the command line, above the model layer.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import CheckpointError
from .loading import HUB_PREFIX, hub_access

#: The files of a pruned checkpoint directory (weights, architecture record).
CHECKPOINT_FILES = ("model.safetensors", "architecture.json")


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
    offline = None
    try:
        with hub_access() as offline:
            folder = snapshot_download(repo_id, revision=revision or None,
                                       allow_patterns=list(CHECKPOINT_FILES) + ["README.md"])
    except Exception as err:  # huggingface_hub raises many types (offline, not found, gated, HTTP)
        detail = f"{offline} and it is not in the local cache" if offline else \
            f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
        raise CheckpointError(
            f"could not fetch {name} ({detail}); check the repository name, your network or login, or with "
            "HF_HUB_OFFLINE=1 that it is in the local Hugging Face cache"
        ) from err
    missing = [f for f in CHECKPOINT_FILES if not (Path(folder) / f).is_file()]
    if missing:
        raise CheckpointError(f"{name} is not a snapvit-pl pruned checkpoint (no {', '.join(missing)})")
    return Path(folder)
