"""DINO self-distillation (SelfDistillationModule): the loss, the teacher's EMA and centre, the frozen prototypes,
and ``snapvit-pl pretrain`` exporting a plain, fixed-size backbone."""
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from snapvit_pl.cli import main as snapvit_main
from snapvit_pl.data import find_fashion_mnist
from snapvit_pl.errors import ConfigError
from snapvit_pl.lightning.self_distillation import SelfDistillationModule, self_distillation_loss
from snapvit_pl.models import load_pruned

ROOT = Path(__file__).resolve().parents[2]
TINY = {"img_size": 28, "patch_size": 7, "in_chans": 1, "embed_dim": 32, "depth": 2, "num_heads": 4, "num_classes": 0}


def test_loss_pairs_every_global_teacher_view_with_every_other_student_view():
    torch.manual_seed(0)
    batch, k, views, globals_ = 3, 5, 4, 2
    student, teacher, center = torch.randn(views * batch, k), torch.randn(globals_ * batch, k), torch.randn(1, k)
    got = self_distillation_loss(student, teacher, center, views, globals_, 0.1, 0.04)
    s, t = student.view(views, batch, k), teacher.view(globals_, batch, k)
    terms = [-(F.softmax((t[g] - center) / 0.04, -1) * F.log_softmax(s[v] / 0.1, -1)).sum(-1).mean()
             for g in range(globals_) for v in range(views) if v != g]
    assert len(terms) == 6 and torch.allclose(got, torch.stack(terms).mean())


class _Trainer:  # what the module reads of its trainer in a training step
    num_training_batches, estimated_stepping_batches, global_step, datamodule = 10, 20, 3, None


def _module(**kwargs):
    torch.manual_seed(0)
    module = SelfDistillationModule(model_kwargs=TINY, out_dim=16, hidden_dim=32, bottleneck_dim=8, local_size=14,
                                    **kwargs)
    module._trainer = _Trainer()
    module.log = lambda *args, **kw: None
    return module


def test_a_step_trains_the_student_and_the_teacher_follows_by_ema():
    module = _module(freeze_last_layer_epochs=1.0)
    views = torch.randn(4, 4, 1, 28, 28)  # 2 global + 2 local views (locals resized to 14 px)
    teacher_before = [p.clone() for p in module.model.parameters()]
    loss = module.training_step(views, 0)
    assert torch.isfinite(loss) and loss.requires_grad
    loss.backward()
    module.on_after_backward()
    assert all(p.grad is None for p in module.student_head.last_layer.parameters())  # frozen in the first epoch
    assert module.student.blocks[0].attn.qkv.weight.grad is not None
    assert all(p.grad is None for p in module.model.parameters())  # the teacher takes no gradient
    assert module.center.abs().sum() > 0  # the centre moved towards the teacher's outputs
    with torch.no_grad():
        for p in module.student.parameters():
            p.add_(1.0)
    module.on_train_batch_end(None, views, 0)
    momentum = module._teacher_momentum()
    for before, teacher, student in zip(teacher_before, module.model.parameters(), module.student.parameters()):
        torch.testing.assert_close(teacher, momentum * before + (1 - momentum) * student)


def test_sinkhorn_targets_are_distributions_that_share_the_prototypes_evenly():
    from snapvit_pl.lightning.self_distillation import sinkhorn_targets

    teacher = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    targets = sinkhorn_targets(teacher, 0.1, iterations=50)
    torch.testing.assert_close(targets.sum(dim=1), torch.ones(64))  # one distribution per sample
    torch.testing.assert_close(targets.sum(dim=0), torch.full((8,), 64 / 8), rtol=1e-3, atol=1e-3)  # equal shares
    module = _module(centering="sinkhorn")
    loss = module.training_step(torch.randn(4, 4, 1, 28, 28), 0)
    assert torch.isfinite(loss) and module.center.abs().sum() == 0  # the running centre is not used


def test_the_contrastive_objective_pulls_the_views_of_one_image_together():
    from snapvit_pl.lightning.self_distillation import multicrop_contrastive_loss

    views, batch = 3, 4
    z = torch.randn(batch, 16, generator=torch.Generator().manual_seed(1))
    aligned = multicrop_contrastive_loss(z.repeat(views, 1), views, 0.2)  # every view of an image the same
    shuffled = multicrop_contrastive_loss(z.repeat(views, 1)[torch.randperm(views * batch)], views, 0.2)
    assert aligned < shuffled
    # by hand: anchor 0's positives are the other views of image 0 (rows 4 and 8)
    e = F.normalize(torch.randn(views * batch, 16, generator=torch.Generator().manual_seed(2)), dim=-1)
    logits = (e @ e.T / 0.2).fill_diagonal_(float("-inf"))
    log_p = F.log_softmax(logits, dim=1)
    by_hand = torch.stack([-log_p[a, [b for b in range(views * batch) if b % batch == a % batch and b != a]].mean()
                           for a in range(views * batch)]).mean()
    torch.testing.assert_close(multicrop_contrastive_loss(e, views, 0.2), by_hand)
    module = _module(objective="contrastive", student_temp=0.2)
    loss = module.training_step(torch.randn(4, 4, 1, 28, 28), 0)
    loss.backward()
    assert module.student.blocks[0].attn.qkv.weight.grad is not None
    assert not any(p.requires_grad for p in module.student_head.last_layer.parameters())  # prototypes unused
    with pytest.raises(ConfigError, match="model.objective must be one of dino, contrastive, got 'byol'"):
        _module(objective="byol")
    with pytest.raises(ConfigError, match="model.centering must be one of mean, sinkhorn, got 'median'"):
        _module(centering="median")


def test_batches_must_be_multicrop_and_the_backbone_headless():
    module = _module()
    with pytest.raises(ConfigError, match="train_views: multicrop"):
        module.training_step(torch.randn(4, 1, 28, 28), 0)
    with pytest.raises(ConfigError, match="num_classes: 0"):
        SelfDistillationModule(model_kwargs={**TINY, "num_classes": 10})


@pytest.mark.skipif(find_fashion_mnist(None) is None, reason="apt-get install dataset-fashion-mnist")
def test_pretrain_exports_a_plain_fixed_size_backbone(tmp_path):
    run = tmp_path / "run"
    code = snapvit_main(["pretrain", "fit", "--config", str(ROOT / "configs" / "train" / "dino_fmnist.yaml"),
                         f"--model.model_kwargs={json.dumps(TINY)}", "--model.out_dim=16", "--model.hidden_dim=32",
                         "--model.knn_train_samples=64", "--model.knn_val_samples=32", "--data.init_args.batch_size=8",
                         "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.enable_progress_bar=false",
                         f"--trainer.default_root_dir={run}", f"--trainer.logger.init_args.save_dir={run}"])
    assert code == 0
    model, record = load_pruned(run / "model")
    assert "dynamic_img_size" not in record["base"]["model_kwargs"] and record["base"]["model_kwargs"]["num_classes"] == 0
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 32)
    assert (run / "tensorboard" / "checkpoints" / "last.ckpt").exists()
