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
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert "val/accuracy" in events.Tags()["scalars"] and "hp_metric" not in events.Tags()["scalars"]  # issue 51


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


def _pruned_run(tmp_path, model_name, kwargs, mlp_ratio, head_ratio):
    """A dense model saved to a local file, then a pruned checkpoint of it in runs/prune/X/models/ (as prune.py
    writes one: it records its base spec and fingerprint); returns the dense model."""
    from safetensors.torch import save_file

    from families import random_elastic_scores
    from snapvit_pl.elastic import Budget
    from snapvit_pl.pipeline import extract_models

    dense = load_backbone(BackboneSpec(model_name, False, None, kwargs))
    save_file(dense.state_dict(), str(tmp_path / "base.safetensors"))
    spec = BackboneSpec(model_name, False, str(tmp_path / "base.safetensors"), kwargs)
    base = load_backbone(spec)
    extract_models(base, random_elastic_scores(base), [Budget(mlp_ratio=mlp_ratio, head_ratio=head_ratio)],
                   save_dir=tmp_path / "runs" / "prune" / "X" / "models", spec=spec)
    return dense


def test_the_finetune_recipe_distills_from_the_recorded_base_into_a_directory_named_after_the_input(tmp_path, monkeypatch):
    spec_kwargs = {"img_size": 28, "patch_size": 4, "in_chans": 1, "embed_dim": 32, "depth": 2, "num_heads": 4,
                   "num_classes": 10}
    dense = _pruned_run(tmp_path, "vit_tiny_patch16_224", spec_kwargs, 0.5, 0.5)
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


def test_the_headless_recipe_distils_a_pruned_backbone_without_labels_and_its_loss_falls(tmp_path, monkeypatch):
    """configs/train/distill_backbone.yaml on a tiny DINO-like model (no classifier head): the cosine distance of
    every token to the unpruned base's falls over training; no labels are read."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    kwargs = {"img_size": 28, "patch_size": 7, "in_chans": 1, "embed_dim": 32, "depth": 2, "num_heads": 4,
              "num_classes": 0}
    _pruned_run(tmp_path, "vit_small_patch16_224.dino", kwargs, 0.6, 0.5)
    monkeypatch.chdir(tmp_path)
    recipe = str(ROOT / "configs" / "train" / "distill_backbone.yaml")
    args = ["fit", "--config", recipe, "--model.checkpoint=runs/prune/X/models/mlp0.60_head0.50", "--model.lr=3e-3",
            "--data.init_args.source=fashion_mnist", "--data.init_args.max_samples=256", "--data.init_args.batch_size=32",
            "--data.init_args.num_workers=0", "--trainer.max_epochs=3", "--trainer.limit_val_batches=2",
            "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false"]
    assert train_main(args) == 0
    out = tmp_path / "runs" / "finetune" / "X-mlp0.60_head0.50"
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    losses = [e.value for e in events.Scalars("train/distill")]
    assert len(losses) == 24 and sum(losses[-4:]) < 0.7 * sum(losses[:4]), losses
    model, record = load_pruned(out / "model")
    assert record["heads"] == [2, 2] and model.num_classes == 0 and "val/loss" in record["extra"]["metrics"]


FINETUNE = str(ROOT / "configs" / "train" / "finetune_pruned.yaml")


def _pruned_pair(tmp_path):
    """Two pruned checkpoints of one tiny base with other widths (two budgets): ``tmp_path/a``, ``tmp_path/b``."""
    spec = BackboneSpec("vit_tiny_patch16_224", False, None, {
        "img_size": 28, "patch_size": 4, "in_chans": 1, "embed_dim": 32, "depth": 2, "num_heads": 4, "num_classes": 10})
    dense = load_backbone(spec)
    for seed, name in ((0, "a"), (1, "b")):
        subnet = random_subnet(dense, seed)
        save_pruned(prune_(load_backbone(spec), subnet), tmp_path / name, spec, subnet)
    assert load_pruned(tmp_path / "a")[1]["heads"] != load_pruned(tmp_path / "b")[1]["heads"]
    return tmp_path / "a", tmp_path / "b"


def _finetune(checkpoint, run, *extra):
    """The fine-tune recipe on ``checkpoint``, cross-entropy only (no teacher to build), a few batches an epoch."""
    return train_main([
        "fit", "--config", FINETUNE, f"--model.checkpoint={checkpoint}", "--model.loss=ce",
        f"--trainer.default_root_dir={run}", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu",
        "--data.init_args.batch_size=8", *extra])


def _one_error_line(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    return errors[0]


def test_a_diverging_finetune_stops_keeps_the_last_finite_checkpoint_and_exports_nothing(tmp_path, capsys, monkeypatch):
    """A loss gone NaN (a learning rate far too high in epoch 1) stops the run with one error line; last.ckpt of
    epoch 0 is kept, finite and not overwritten; no model is exported (the run's model would be all NaN)."""
    from snapvit_pl.lightning.finetune_module import FinetuneModule

    a, _ = _pruned_pair(tmp_path)
    real = FinetuneModule.on_train_epoch_start

    def too_high_in_epoch_1(self):
        real(self)
        if self.current_epoch == 1:
            for group in self.trainer.optimizers[0].param_groups:
                group["lr"] = 1e30  # one step at this rate: the next loss is NaN

    monkeypatch.setattr(FinetuneModule, "on_train_epoch_start", too_high_in_epoch_1)
    run = tmp_path / "run"
    assert _finetune(a, run, "--trainer.max_epochs=2") == 2
    last = run / "tensorboard" / "checkpoints" / "last.ckpt"
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: training diverged: train/loss is nan at epoch 1") and f"--ckpt_path {last}" in line
    assert "--model.lr" in line and not (run / "model").exists()
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["global_step"] == 3 and all(torch.isfinite(v).all() for v in state["state_dict"].values())


def test_a_learning_rate_that_diverges_at_once_exports_nothing(tmp_path, capsys):
    a, _ = _pruned_pair(tmp_path)
    run = tmp_path / "run"
    assert _finetune(a, run, "--trainer.max_epochs=1", "--model.lr=1e30") == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "train/loss is nan at epoch 0" in line and "No checkpoint was saved before it" in line
    assert not (run / "model").exists() and not list(run.rglob("*.ckpt"))


def test_resuming_from_the_finetune_of_another_pruned_model_is_refused(tmp_path, capsys):
    """The last.ckpt of budget b's fine-tune given to budget a's (as --ckpt_path FILE, a config's ckpt_path, or found
    as --ckpt_path last) is refused before training: it would export b's weights as a's fine-tuned model."""
    a, b = _pruned_pair(tmp_path)
    assert _finetune(b, tmp_path / "run_b", "--trainer.max_epochs=1") == 0
    other = tmp_path / "run_b" / "tensorboard" / "checkpoints" / "last.ckpt"
    # issue 48: the run says where its model is, and a run of 3 steps logs its loss and learning rate (every 50 before)
    assert f"the trained model is in {tmp_path / 'run_b' / 'model'}" in capsys.readouterr().out
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run_b" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    # issue 51: one learning-rate curve (the weight-decay split's two groups share one rate)
    assert {"train/loss", "lr-AdamW"} <= tags and not {t for t in tags if t.startswith("lr-AdamW/")}, tags
    (tmp_path / "resume.yaml").write_text(f"ckpt_path: {other}\n")
    found = tmp_path / "run_a" / "tensorboard" / "checkpoints" / "last.ckpt"  # what --ckpt_path last finds
    found.parent.mkdir(parents=True)
    found.write_bytes(other.read_bytes())
    for how, named in ((["--ckpt_path", str(other)], other), ([f"--config={tmp_path / 'resume.yaml'}"], other),
                       (["--ckpt_path", "last"], found)):
        assert _finetune(a, tmp_path / "run_a", "--trainer.max_epochs=2", *how) == 2, how
        line = _one_error_line(capsys.readouterr().err)
        assert f"--ckpt_path {named} is the fine-tune of another model, {b}" in line and f"not of {a}" in line, line
        assert not (tmp_path / "run_a" / "model").exists()
    unrecorded = torch.load(other, map_location="cpu", weights_only=False)
    del unrecorded["snapvit_architecture"]  # a checkpoint that says nothing of its model is not trusted either
    torch.save(unrecorded, tmp_path / "unrecorded.ckpt")
    assert _finetune(b, tmp_path / "run_b2", "--ckpt_path", str(tmp_path / "unrecorded.ckpt")) == 2
    assert "records no model architecture" in _one_error_line(capsys.readouterr().err)
    # issue 48: its own checkpoint, on other data (another subset of the training images) is refused too
    assert _finetune(b, tmp_path / "run_b2", "--trainer.max_epochs=2", "--ckpt_path", str(other),
                     "--data.init_args.max_samples=64") == 2
    assert f"--ckpt_path {other} was trained on other data" in _one_error_line(capsys.readouterr().err)
    assert _finetune(b, tmp_path / "run_b2", "--trainer.max_epochs=2", "--ckpt_path", str(other)) == 0  # its own
    assert load_pruned(tmp_path / "run_b2" / "model")[1]["heads"] == load_pruned(b)[1]["heads"]


@pytest.mark.parametrize("option, refused", [
    ("--model.lr=-0.1", "model.lr must be a number > 0, got -0.1"),
    ("--model.label_smoothing=1", "model.label_smoothing must be a number >= 0 and < 1, got 1.0"),
    ("--model.distill_weight=-1", "model.distill_weight must be a number >= 0, got -1.0"),
    ("--model.warmup_epochs=-1", "model.warmup_epochs must be a number >= 0, got -1.0"),
    ("--model.temperature=0", "model.temperature must be a number > 0, got 0.0"),
    ("--model.loss=kd", "model.loss must be one of ce, distill, both, got 'kd'"),
    ("--model.distill=l1", "model.distill must be one of kl, cosine, mse, got 'l1'"),
    ("--model.distill_tokens=patch", "model.distill_tokens must be one of class, all, got 'patch'"),
])
def test_out_of_range_numbers_and_unknown_words_are_refused_when_parsed(tmp_path, capsys, option, refused):
    run = tmp_path / "run"
    assert train_main(["fit", "--config", FINETUNE, f"--model.checkpoint={tmp_path / 'absent'}",
                       f"--trainer.default_root_dir={run}", option]) == 2
    assert _one_error_line(capsys.readouterr().err).startswith(f"error: {refused}")
    assert not run.exists()  # refused before anything was built or written
