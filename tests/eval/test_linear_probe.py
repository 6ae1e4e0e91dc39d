import torch

from snapvit_pl.eval.linear_probe import LinearProbe, linear_probe


def linearly_separable(n, dim=16, num_classes=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(dim, num_classes, generator=torch.Generator().manual_seed(123))
    features = torch.randn(n, dim, generator=generator) * 3 + 1
    return features, (features @ weights).argmax(1)


def test_learns_linearly_separable_toy_set():
    train_x, train_y = linearly_separable(1000, seed=0)
    test_x, test_y = linearly_separable(500, seed=1)
    result = linear_probe(train_x, train_y, test_x, test_y, lrs=(1e-3, 1e-2, 1e-1), epochs=100)
    assert result.test_accuracy >= 0.95
    assert set(result.val_accuracy) == {1e-3, 1e-2, 1e-1}
    assert result.val_accuracy[result.best_lr] == max(result.val_accuracy.values())
    assert isinstance(result.probe, LinearProbe)


def test_sweep_is_seeded():
    train_x, train_y = linearly_separable(300, seed=2)
    test_x, test_y = linearly_separable(100, seed=3)
    runs = [linear_probe(train_x, train_y, test_x, test_y, lrs=(1e-2, 1e-1), epochs=10, batch_size=64, seed=5) for _ in range(2)]
    assert runs[0].val_accuracy == runs[1].val_accuracy
    assert torch.equal(runs[0].probe.linear.weight, runs[1].probe.linear.weight)


def test_lightning_steps_run_in_a_trainer():
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset

    features, labels = linearly_separable(256, seed=4)
    probe = LinearProbe(16, 4, lr=1e-2, max_epochs=2)
    probe.set_feature_statistics(features)
    loader = DataLoader(TensorDataset(features, labels), batch_size=128)
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(probe, loader, loader)
    assert {"train/loss", "train/acc", "val/acc"} <= set(trainer.callback_metrics)
    (metrics,) = trainer.test(probe, loader, verbose=False)
    assert 0.0 <= metrics["test/acc"] <= 1.0
