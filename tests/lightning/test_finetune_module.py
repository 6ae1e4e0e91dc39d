"""A fine-tune checkpoint holds the student and its optimiser state, not the frozen teacher: the teacher is rebuilt
from the base recorded in the pruned checkpoint when the run resumes, and must be the one it was trained with."""
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from families import random_subnet
from snapvit_pl.cli import train_main
from snapvit_pl.models import BackboneSpec, fingerprint, load_backbone, prune_, save_pruned

ROOT = Path(__file__).resolve().parents[2]
DISTILL = str(ROOT / "configs" / "train" / "distill_backbone.yaml")
pytestmark = pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(),
                                reason="apt-get install dataset-fashion-mnist")


def _headless(tmp_path):
    spec = BackboneSpec("vit_tiny_patch16_224", False, str(tmp_path / "base.safetensors"), {
        "img_size": 28, "patch_size": 4, "in_chans": 1, "embed_dim": 32, "depth": 2, "num_heads": 4, "num_classes": 0})
    dense = load_backbone(BackboneSpec(spec.model_name, False, None, spec.model_kwargs))
    save_file(dense.state_dict(), spec.checkpoint_path)
    subnet = random_subnet(dense, 0)
    extra = {"base_spec": spec.to_dict(), "base_fingerprint": fingerprint(dense)}
    return save_pruned(prune_(load_backbone(spec), subnet), tmp_path / "pruned", spec, subnet, extra=extra), spec


def _fit(pruned, run, *extra):
    return train_main([
        "fit", "--config", DISTILL, f"--model.checkpoint={pruned}", f"--trainer.default_root_dir={run}",
        "--data.init_args.source=fashion_mnist", "--data.init_args.root=null", "--data.init_args.max_samples=64",
        "--data.init_args.batch_size=16", "--data.init_args.num_workers=0", "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false", "--trainer.accelerator=cpu", *extra])


def test_the_checkpoint_holds_no_teacher_and_resumes_with_the_rebuilt_one(tmp_path, capsys, monkeypatch):
    pruned, spec = _headless(tmp_path)
    run = tmp_path / "run"
    assert _fit(pruned, run, "--trainer.max_epochs=1") == 0
    last = run / "tensorboard" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    keys = list(checkpoint["state_dict"])
    assert keys and all(k.startswith("model.") for k in keys), keys[:5]  # the student only
    assert checkpoint["teacher_fingerprint"] == fingerprint(load_backbone(spec))
    (run / "model").rename(tmp_path / "first_model")  # the export of the first run, out of the way
    from snapvit_pl.lightning.finetune_module import FinetuneModule

    loaded = []
    real = FinetuneModule.on_load_checkpoint
    monkeypatch.setattr(FinetuneModule, "on_load_checkpoint", lambda self, c: loaded.append(c["global_step"]) or real(self, c))
    assert _fit(pruned, run, "--trainer.max_epochs=2", "--ckpt_path", "last") == 0
    assert loaded == [2]  # resumed from the end of epoch 0, strictly (the rebuilt teacher's weights given back)
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 4

    other = {k: v + 0.01 for k, v in load_backbone(spec).state_dict().items()}
    save_file(other, str(tmp_path / "other.safetensors"))  # another teacher than the one it was trained with
    (tmp_path / "other" / "tensorboard" / "checkpoints").mkdir(parents=True)
    (tmp_path / "other" / "tensorboard" / "checkpoints" / "last.ckpt").write_bytes(last.read_bytes())
    code = _fit(pruned, tmp_path / "other", "--trainer.max_epochs=3", "--ckpt_path=last",
                f"--model.teacher_checkpoint_path={tmp_path / 'other.safetensors'}",
                f"--model.teacher_model_name={spec.model_name}", "--model.teacher_pretrained=false")
    err = capsys.readouterr().err
    assert code == 2 and "is not the one the checkpoint was trained with" in err and "Traceback" not in err


@pytest.mark.parametrize("argument", [{"lr": -0.1}, {"label_smoothing": 1.0}, {"temperature": 0.0},
                                      {"distill_weight": -1.0}, {"warmup_epochs": -1.0}, {"weight_decay": -0.01}])
def test_out_of_range_numbers_are_refused_from_python_too(argument):
    """The ranges the command line reads from the constructor's types are checked when it is called from Python,
    before any model is built."""
    from snapvit_pl.errors import ConfigError
    from snapvit_pl.lightning.finetune_module import FinetuneModule

    (name, value), = argument.items()
    with pytest.raises(ConfigError, match=f"^model.{name} must be a "):
        FinetuneModule(checkpoint="/nonexistent", **argument)
