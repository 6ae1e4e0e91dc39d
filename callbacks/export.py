"""Export stage: the elastic-scores artifact and the pruned checkpoints asked for (``on_fit_end``)."""
from __future__ import annotations

import sys
from typing import Optional

import pytorch_lightning as pl
from tqdm.auto import tqdm

from snapvit_pl.errors import SnapViTError
from snapvit_pl.lightning.pruning_module import PruningModule
from snapvit_pl.pipeline import CorrectionSettings, EvaluationSettings, ExportSettings, SearchSettings, check_budgets
from snapvit_pl.pipeline.stages import export_from_datamodule


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
        bar = tqdm(total=len(self.settings.budget_list()), desc="export", unit="model", dynamic_ncols=True,
                   disable=trainer.progress_bar_callback is None or not sys.stderr.isatty())

        def finished(item) -> None:
            bar.update()
            bar.set_postfix_str(f"{item.label}: " + ", ".join(f"{k} {100 * v:.1f}" for k, v in (item.metrics or {}).items()
                                                             if k.endswith("_top1")))

        export_from_datamodule(pl_module.state, pl_module.backbone, trainer.datamodule, self.settings, self.correction,
                               self.evaluation, self.search, trainer.default_root_dir, trainer.strategy.root_device,
                               on_model=finished)
        bar.close()
