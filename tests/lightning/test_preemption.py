"""A fine-tune preempted by SIGTERM in the middle of an epoch saves a checkpoint, exits non-zero, and ``--ckpt_path
last`` continues from it to exactly the weights of an uninterrupted run (the rest of the epoch's batches, the
dropout masks, the optimiser state); the checkpoints hold no teacher weights."""
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from families import random_subnet
from snapvit_pl.cli import train_main
from snapvit_pl.models import BackboneSpec, fingerprint, load_backbone, prune_, save_pruned

ROOT = Path(__file__).resolve().parents[2]
FINETUNE = str(ROOT / "configs" / "train" / "finetune_pruned.yaml")
BATCHES = 4
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(),
                                                   reason="apt-get install dataset-fashion-mnist")]


@pytest.fixture
def pruned(tmp_path):
    """A pruned checkpoint of a small Fashion-MNIST ViT (dropout and drop-path on), its base recorded as prune.py
    records it: the teacher of the distillation is rebuilt from that record."""
    spec = BackboneSpec("vit_tiny_patch16_224", False, str(tmp_path / "base.safetensors"), {
        "img_size": 28, "patch_size": 4, "in_chans": 1, "embed_dim": 32, "depth": 2, "num_heads": 4, "num_classes": 10,
        "drop_rate": 0.1, "drop_path_rate": 0.1})
    dense = load_backbone(BackboneSpec(spec.model_name, False, None, spec.model_kwargs))
    save_file(dense.state_dict(), spec.checkpoint_path)
    subnet = random_subnet(dense, 0)
    extra = {"base_spec": spec.to_dict(), "base_fingerprint": fingerprint(dense)}
    return save_pruned(prune_(load_backbone(spec), subnet), tmp_path / "pruned", spec, subnet, extra=extra)


def _fit(pruned, run: Path, *extra: str) -> int:
    return train_main([
        "fit", "--config", FINETUNE, f"--model.checkpoint={pruned}", f"--trainer.default_root_dir={run}",
        "--trainer.max_epochs=2", f"--trainer.limit_train_batches={BATCHES}", "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu",
        "--data.init_args.batch_size=8", "--data.init_args.num_workers=1", "--data.init_args.train_augment=true",
        *extra])


def _last(run: Path) -> dict:
    return torch.load(run / "tensorboard" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)


def test_sigterm_mid_epoch_saves_a_checkpoint_and_the_resume_matches_an_uninterrupted_run(pruned, tmp_path, capsys):
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    stop = '--trainer.callbacks+={"class_path": "faults.SigtermAt", "init_args": {"epoch": 0, "batch": 1}}'
    assert _fit(pruned, resumed, stop) == 130
    err = capsys.readouterr().err
    assert "interrupted (SIGTERM)" in err and "--ckpt_path last" in err and "Traceback" not in err
    saved = _last(resumed)
    assert saved["global_step"] == 2 and not (resumed / "model").exists()  # mid-epoch 0: nothing exported
    assert not [k for k in saved["state_dict"] if k.startswith("teacher.")]  # the teacher is rebuilt, not stored

    assert _fit(pruned, resumed, "--ckpt_path", "last") == 0
    assert _fit(pruned, straight) == 0
    a, b = _last(resumed), _last(straight)
    assert a["global_step"] == b["global_step"] == 2 * BATCHES and a["state_dict"].keys() == b["state_dict"].keys()
    for name in a["state_dict"]:
        assert torch.equal(a["state_dict"][name], b["state_dict"][name]), name
    for state_a, state_b in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(torch.as_tensor(state_a[k]), torch.as_tensor(state_b[k])) for k in state_a)
    from safetensors.torch import load_file

    exported = load_file(resumed / "model" / "model.safetensors"), load_file(straight / "model" / "model.safetensors")
    assert all(torch.equal(exported[0][k], exported[1][k]) for k in exported[0])


def test_a_damaged_checkpoint_is_refused_on_resume(pruned, tmp_path, capsys):
    run = tmp_path / "run"
    assert _fit(pruned, run, "--trainer.max_epochs=1") == 0
    path = run / "tensorboard" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    name = next(iter(checkpoint["state_dict"]))
    checkpoint["state_dict"][name].view(-1)[0] += 1.0  # what a flipped bit in the weights does
    torch.save(checkpoint, path)
    assert _fit(pruned, tmp_path / "run2", "--ckpt_path", str(path)) == 2
    err = capsys.readouterr().err
    assert "does not match its checksum" in err and "Traceback" not in err
