"""Issue 51: one learning-rate curve per distinct rate (Lightning's monitor logged the weight-decay split of one rate
as two identical curves, lr-AdamW/pg1 and pg2)."""
import pytorch_lightning as pl
import torch
from torch import nn

from snapvit_pl.callbacks import LearningRateCallback
from snapvit_pl.lightning.training import adamw, learning_rates


def test_groups_of_one_rate_give_one_curve_and_rates_that_differ_one_each():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    optimizer = adamw([model], 1e-3, 0.05)
    assert len(optimizer.param_groups) == 2 and learning_rates([optimizer]) == {"lr-AdamW": 1e-3}
    optimizer.param_groups[1]["lr"] = 5e-4
    assert learning_rates([optimizer]) == {"lr-AdamW/pg1": 1e-3, "lr-AdamW/pg2": 5e-4}
    optimizer.add_param_group({"params": [nn.Parameter(torch.zeros(2))], "lr": 1e-3, "name": "head"})
    assert learning_rates([optimizer]) == {"lr-AdamW/pg1": 1e-3, "lr-AdamW/pg2": 5e-4}  # a rate seen before: no curve


class _Recorder(pl.loggers.Logger):
    name, version = "recorder", 0

    def __init__(self):
        super().__init__()
        self.logged = []

    def log_hyperparams(self, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.logged.append((step, dict(metrics)))


class _Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(4, 1), nn.LayerNorm(1))

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return adamw([self.layer], 1e-2, 0.05)


def test_the_callback_logs_one_rate_at_every_logging_step():
    recorder = _Recorder()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 4)), batch_size=2)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=recorder, log_every_n_steps=2,
                         callbacks=[LearningRateCallback()], enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(_Tiny(), data)
    rates = [(step, m) for step, m in recorder.logged if any(k.startswith("lr-") for k in m)]
    assert [step for step, _ in rates] == [0, 2, 4] and all(m == {"lr-AdamW": 1e-2} for _, m in rates)
