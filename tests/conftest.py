import os
import sys
from pathlib import Path

import pytest
import torch

# One torch thread in every process the tests start (prune.py and train.py runs, DDP ranks): the models are tiny,
# and two threads on a busy 2-core machine spin-wait in OpenMP (measured: 7x slower under load).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# tests/<pkg>/ helper modules (e.g. tests/models/families.py, tests/search/ask_tell.py, tests/cli/run_helpers.py,
# tests/lightning/compose.py, tests/correction/calibration.py, tests/faults.py) are importable by name.
for _helpers in ("", "models", "search", "cli", "lightning", "correction"):
    sys.path.insert(0, str(Path(__file__).parent / _helpers))


def pytest_collection_modifyitems(config, items):
    """The slow files first (pyproject.toml's addopts hand files to the two workers in this order): the longest work
    starts early and the short files fill in at the end, instead of one worker finishing a long file alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory):
    """``(HF_HOME, models)``: an offline Hugging Face cache with small random-weight models (tests/models/hub_cache.py)."""
    from hub_cache import build_cache

    home = tmp_path_factory.mktemp("hf_home")
    return home, build_cache(home)


@pytest.fixture
def offline_hub(hf_cache, monkeypatch):
    """Point huggingface_hub (already imported) at the offline cache for this test; returns the env for subprocesses."""
    import huggingface_hub.constants as constants

    home, models = hf_cache
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return env, models


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    """Seeded, and one intra-op thread: the models here are tiny, so one thread is as fast, and immune to
    OpenMP spin-waits on a busy 2-core machine (measured under load: 9 s with one thread against 90 s with two)."""
    torch.manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TINY_MODEL = [  # random weights: the shipped reference checkpoint has another width
    "--model.checkpoint_path=null", "--model.model_kwargs.embed_dim=32", "--model.model_kwargs.depth=2", "--model.model_kwargs.num_heads=4",
]


@pytest.fixture
def tiny_prune_args(tmp_path):
    """Command-line overrides that shrink the demo config to a few seconds of work."""
    return [
        "--out_dir", str(tmp_path / "run"), *TINY_MODEL,
        "--data.init_args.max_samples=48", "--data.init_args.batch_size=16",
        "--data.init_args.n_local_views=2",
        "--search.max_evaluations=4", "--search.num_images=32", "--search.batch_size=32", "--search.pca_components=8",
        "--export.budgets=[{mlp_ratio: 0.35, head_ratio: 0.25}, {flops: 0.6}]",
        "--evaluation.train_samples=100", "--evaluation.val_samples=50", "--evaluation.knn_k=5",
        "--report.print_table=false",
        "--trainer.enable_progress_bar=false", "--trainer.logger=true",
    ]


@pytest.fixture
def folder_run(tiny_prune_args, tmp_path):
    """A ``prune.py`` run (in this process) on a folder of images asked for sparsity 0.4, and the arguments that ran
    it (without budget and folder)."""
    from images import gray_image_folder

    from snapvit_pl.cli.prune import prune_main

    data = gray_image_folder(tmp_path / "data")
    args = [a for a in tiny_prune_args if not a.startswith(("--export.budgets", "--out_dir", "--data.init_args.max"))
            and a != str(tmp_path / "run")] + [
        "--data.init_args.source=folder", f"--data.init_args.root={data}", "--data.init_args.max_samples=32",
        "--search.max_evaluations=0", "--evaluation.metrics=[]"]
    assert prune_main([*args, "--out_dir", str(tmp_path / "run"), "--export.budgets=[{sparsity: 0.4}]"]) == 0
    return tmp_path / "run", data, args
