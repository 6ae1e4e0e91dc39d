import subprocess
import sys
from pathlib import Path

import pytest
import torch

from families import random_subnet
from snapvit_pl.cli import train_main
from snapvit_pl.models import BackboneSpec, architecture, load_backbone, load_pruned, prune_, save_pruned

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "train" / "reference_fmnist.yaml")
pytestmark = pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="apt-get install dataset-fashion-mnist")

TINY = ["--model.model_kwargs.embed_dim=32", "--model.model_kwargs.depth=2", "--model.model_kwargs.num_heads=4"]


def _quick(run: Path) -> list[str]:
    return [
        f"--trainer.default_root_dir={run}", f"--trainer.logger.init_args.save_dir={run}", "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2", "--trainer.enable_progress_bar=false",
        "--data.init_args.batch_size=16", "--data.init_args.num_workers=0",
    ]


def test_train_dense_model_from_scratch_saves_loadable_checkpoint(tmp_path):
    assert train_main(["fit", "--config", CONFIG, *TINY, *_quick(tmp_path / "run")]) == 0
    model, record = load_pruned(tmp_path / "run" / "model")
    assert record["heads"] == [4, 4] and "val/accuracy" in record["extra"]["metrics"]
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_polish_stage_continues_from_the_first_stage(tmp_path):
    """The reference recipe's second stage (configs/train/reference_fmnist_polish.yaml) starts from stage 1's model."""
    assert train_main(["fit", "--config", CONFIG, *TINY, *_quick(tmp_path / "stage1")]) == 0
    polish = str(ROOT / "configs" / "train" / "reference_fmnist_polish.yaml")
    assert train_main(["fit", "--config", polish, f"--model.checkpoint={tmp_path / 'stage1' / 'model'}",
                       *_quick(tmp_path / "stage2")]) == 0
    first, _ = load_pruned(tmp_path / "stage1" / "model")
    second, record = load_pruned(tmp_path / "stage2" / "model")
    assert record["extra"]["trained_from"] == str(tmp_path / "stage1" / "model") and record["heads"] == [4, 4]
    assert any(not torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))


def test_finetune_pruned_checkpoint_with_distillation(tmp_path):
    spec = BackboneSpec("vit_tiny_patch16_224", False, None, {
        "img_size": 28, "patch_size": 4, "in_chans": 1, "embed_dim": 32, "depth": 2, "num_heads": 4, "num_classes": 10,
    })
    dense = load_backbone(spec)
    from safetensors.torch import save_file

    save_file(dense.state_dict(), str(tmp_path / "teacher.safetensors"))
    subnet = random_subnet(dense, 0)
    pruned = prune_(load_backbone(spec), subnet)
    save_pruned(pruned, tmp_path / "pruned", spec, subnet)
    args = [
        "fit", "--config", CONFIG, *_quick(tmp_path / "run"), f"--model.checkpoint={tmp_path / 'pruned'}",
        "--model.model_name=null", "--model.loss=both", "--model.distill=kl",
        f"--model.teacher_checkpoint_path={tmp_path / 'teacher.safetensors'}",
    ]
    assert train_main(args) == 0
    model, record = load_pruned(tmp_path / "run" / "model")
    assert architecture(model) == architecture(pruned)
    assert record["extra"]["trained_from"] == str(tmp_path / "pruned")
    changed = any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), pruned.state_dict().values()))
    assert changed, "fine-tuning must update the weights"


def test_missing_model_is_a_clear_error(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "fit", "--config", CONFIG, "--model.model_name=null", *_quick(tmp_path / "run")],
        capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert "give model.checkpoint (a pruned checkpoint) or model.model_name" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_second_run_does_not_replace_the_exported_model(tmp_path, capsys):
    args = ["fit", "--config", CONFIG, *TINY, *_quick(tmp_path / "run")]
    assert train_main(args) == 0
    before = (tmp_path / "run" / "model" / "model.safetensors").read_bytes()
    assert train_main(args) == 2
    assert "already holds a model exported by an earlier run" in capsys.readouterr().err
    assert (tmp_path / "run" / "model" / "model.safetensors").read_bytes() == before


def test_the_finetune_recipe_distills_from_the_recorded_base_into_a_directory_named_after_the_input(tmp_path, monkeypatch):
    from snapvit_pl.pipeline import extract_models
    from families import random_elastic_scores
    from snapvit_pl.elastic import Budget
    from safetensors.torch import save_file

    spec_kwargs = {"img_size": 28, "patch_size": 4, "in_chans": 1, "embed_dim": 32, "depth": 2, "num_heads": 4,
                   "num_classes": 10}
    dense = load_backbone(BackboneSpec("vit_tiny_patch16_224", False, None, spec_kwargs))
    save_file(dense.state_dict(), str(tmp_path / "base.safetensors"))
    spec = BackboneSpec("vit_tiny_patch16_224", False, str(tmp_path / "base.safetensors"), spec_kwargs)
    base = load_backbone(spec)
    extract_models(base, random_elastic_scores(base), [Budget(mlp_ratio=0.5, head_ratio=0.5)],
                   save_dir=tmp_path / "runs" / "prune" / "X" / "models", spec=spec)
    monkeypatch.chdir(tmp_path)
    checkpoint = tmp_path / "runs" / "prune" / "X" / "models" / "mlp0.50_head0.50"
    recipe = str(ROOT / "configs" / "train" / "finetune_pruned.yaml")
    quick = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--trainer.max_epochs=1",
             "--trainer.enable_progress_bar=false", "--data.init_args.batch_size=8"]
    assert train_main(["fit", "--config", recipe, f"--model.checkpoint={checkpoint}", *quick]) == 0
    out = tmp_path / "runs" / "finetune" / "X-mlp0.50_head0.50"
    model, record = load_pruned(out / "model")
    assert record["heads"] == [2, 2] and list((out / "tensorboard").glob("events.out.tfevents.*"))
    from snapvit_pl.lightning.finetune_module import FinetuneModule
    from snapvit_pl.models import fingerprint

    teacher = FinetuneModule(checkpoint=str(checkpoint), loss="both").teacher  # the base it was cut from
    assert fingerprint(teacher) == fingerprint(dense)
