"""What the tests of whole prune.py runs share: the subprocess environment, waiting for a point of a running run,
the digests that say two runs wrote the same files."""
import hashlib
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from snapvit_pl.run.names import RESUME_FILE


#: A whole prune.py run in seconds: a tiny random-weight model, 32 images, one budget, no split grid.
TINY_RUN = ["--model.checkpoint_path=null", "--model.model_kwargs.embed_dim=32", "--model.model_kwargs.depth=2",
            "--model.model_kwargs.num_heads=4", "--data.init_args.max_samples=32", "--data.init_args.batch_size=16",
            "--data.init_args.n_local_views=2", "--search.num_images=32", "--search.pca_components=8",
            "--export.split_grid=0", "--export.budgets=[{sparsity: 0.3}]"]


def env(**extra: str) -> dict:
    """One torch thread: these models are tiny, and two threads on a busy 2-core machine spin (several times slower)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def wait_for(run: Path, process: subprocess.Popen, ready, timeout: float = 600) -> None:
    """Poll ``run``'s resume state until ``ready(state)`` (fails if the run ends first)."""
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        state_file = run / RESUME_FILE
        if state_file.exists():
            try:
                state = torch.load(state_file, weights_only=True)
            except Exception:  # being replaced at this moment
                continue
            if ready(state):
                return
        time.sleep(0.05)
    pytest.fail("the run ended before the awaited point")


def in_search(state) -> bool:
    """Saved in the middle of a generation (some of its candidates evaluated, not all)."""
    progress = state.get("search") or {}
    return bool(progress) and progress["pending"] is not None


def digests(run: Path) -> dict[str, str]:
    """sha256 of the scores file and of every file of every model."""
    files = [run / "elastic_scores.safetensors", *sorted((run / "models").glob("*/*"))]
    return {str(f.relative_to(run)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
