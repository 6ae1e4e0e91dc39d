"""Export stage: the elastic-scores artifact and the pruned checkpoints asked for (``on_fit_end``)."""
from __future__ import annotations

import sys
from typing import Optional

import pytorch_lightning as pl
from tqdm.auto import tqdm

from snapvit_pl.errors import SnapViTError
from snapvit_pl.eval.suite import EvalData
from snapvit_pl.lightning.pruning_module import PruningModule
from snapvit_pl.pipeline import (
    Correction, CorrectionSettings, Evaluation, EvaluationSettings, ExportSettings, SearchSettings, check_budgets,
    export_stage,
)


class ExportCallback(pl.Callback):
    """Saves ``elastic_scores.safetensors``, then cuts, corrects (when enabled), evaluates and saves one
    model per budget (:func:`snapvit_pl.pipeline.export_stage`). Rank 0 only: the other ranks have no
    work left once the search is done.

    Args:
        settings: budgets, rounding, what to save.
        correction: the optional weight correction.
        evaluation: the evaluation of the dense and every extracted model.
        search: the search settings (their fitness images and PCA also choose the budgets' splits).
    """

    def __init__(self, settings: Optional[ExportSettings] = None, correction: Optional[CorrectionSettings] = None,
                 evaluation: Optional[EvaluationSettings] = None, search: Optional[SearchSettings] = None):
        self.settings = settings or ExportSettings()
        self.correction = correction or CorrectionSettings()
        self.evaluation = evaluation if evaluation is not None else EvaluationSettings()
        self.search = search or SearchSettings()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        """Fail before the expensive stages if a budget cannot be met under the keep ratios."""
        state = pl_module.state
        check_budgets(pl_module.backbone, self.settings.budget_list(), state.min_mlp_keep, state.min_head_keep,
                      self.settings.mlp_multiple)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        if pl_module.state.local is None:
            raise SnapViTError("no importance scores were computed: the pruning data loader produced no batch")
        if not trainer.is_global_zero:
            return
        datamodule, device = trainer.datamodule, trainer.strategy.root_device
        correction = None
        if self.correction.enabled:
            images = datamodule.unlabeled_images(self.correction.num_samples, self.correction.batch_size)
            correction = Correction(self.correction, images)
        evaluation = None
        if self.evaluation.metrics:
            s = self.evaluation
            evaluation = Evaluation(s, EvalData.from_datamodule(datamodule, s.train_samples, s.val_samples, s.batch_size),
                                    device)
        fitness_images = None
        if self.settings.split == "fitness":
            fitness_images = datamodule.unlabeled_images(self.search.num_images, self.search.batch_size).to(device)
        budgets = self.settings.budget_list()
        bar = tqdm(total=len(budgets), desc="export", unit="model", dynamic_ncols=True,
                   disable=trainer.progress_bar_callback is None or not sys.stderr.isatty())
        bar.set_postfix_str("choosing splits, evaluating the dense model" if evaluation else "")

        def finished(item) -> None:
            bar.update()
            bar.set_postfix_str(f"{item.label}: " + ", ".join(f"{k} {100 * v:.1f}" for k, v in (item.metrics or {}).items()
                                                             if k.endswith("_top1")))

        export_stage(pl_module.state, pl_module.backbone, self.settings, trainer.default_root_dir, correction, evaluation,
                     fitness_images, on_model=finished)
        bar.close()
