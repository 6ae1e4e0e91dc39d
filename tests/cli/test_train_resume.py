"""train.py killed after a checkpoint and resumed (--ckpt_path last) ends with the weights of an uninterrupted run.

Every source of randomness is switched on (dropout, drop-path, timm's training augmentation, a
persistent data-loading worker), so the test covers the data order, the augmentation seeds, the
RNG state of the model's random layers, and the optimizer / LR-scheduler state.
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "train" / "reference_fmnist.yaml")
BATCHES = 4
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="apt-get install dataset-fashion-mnist"),
]

# Loaded by the killed run through PYTHONPATH: SIGKILL (no clean-up, like an OOM kill or a lost
# node) in the middle of epoch 1, i.e. after epoch 0's checkpoint was written.
KILLER = '''
import os, signal
import pytorch_lightning as pl

class KillAt(pl.Callback):
    def __init__(self, epoch: int, batch: int):
        self.epoch, self.batch = epoch, batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            os.kill(os.getpid(), signal.SIGKILL)
'''


def _train(run: Path, *extra: str, env: dict) -> subprocess.CompletedProcess:
    args = [
        sys.executable, str(ROOT / "train.py"), "fit", "--config", CONFIG,
        "--model.model_kwargs.embed_dim=32", "--model.model_kwargs.depth=2", "--model.model_kwargs.num_heads=4",
        "--model.model_kwargs.drop_rate=0.1", "--model.model_kwargs.drop_path_rate=0.1",
        "--data.init_args.train_augment=true", "--data.init_args.batch_size=16", "--data.init_args.num_workers=1",
        f"--trainer.default_root_dir={run}", f"--trainer.logger.init_args.save_dir={run}", "--trainer.max_epochs=2",
        f"--trainer.limit_train_batches={BATCHES}", "--trainer.limit_val_batches=2",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", *extra,
    ]
    return subprocess.run(args, capture_output=True, text=True, cwd=run.parent, env=env, timeout=600)


def _last(run: Path) -> dict:
    return torch.load(run / "tensorboard" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)


def test_killed_then_resumed_run_matches_uninterrupted_run(tmp_path):
    (tmp_path / "killer.py").write_text(KILLER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"

    kill = '--trainer.callbacks+={"class_path": "killer.KillAt", "init_args": {"epoch": 1, "batch": 1}}'
    killed = _train(resumed, kill, env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert _last(resumed)["global_step"] == BATCHES  # the checkpoint of epoch 0, nothing later
    assert not (resumed / "model").exists()

    again = _train(resumed, "--ckpt_path", "last", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Restored all states from the checkpoint" in again.stderr + again.stdout
    uninterrupted = _train(straight, env=env)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]

    a, b = _last(resumed), _last(straight)
    assert a["global_step"] == b["global_step"] == 2 * BATCHES
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for name in a["state_dict"]:
        assert torch.equal(a["state_dict"][name], b["state_dict"][name]), name
    for state_a, state_b in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(torch.as_tensor(state_a[k]), torch.as_tensor(state_b[k])) for k in state_a)
    assert a["lr_schedulers"] == b["lr_schedulers"]
    exported_a, exported_b = load_file(resumed / "model" / "model.safetensors"), load_file(straight / "model" / "model.safetensors")
    assert all(torch.equal(exported_a[k], exported_b[k]) for k in exported_a)
