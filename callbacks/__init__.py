"""Thin Lightning callbacks, one per pipeline stage, installed as ``snapvit_pl.callbacks``.

Each hook runs one stage of the module's :class:`snapvit_pl.pipeline.Pipeline`, after the run's earlier stages in
the order of :data:`snapvit_pl.pipeline.STAGES`; each callback is optional (its absence leaves its stage out:
:class:`snapvit_pl.lightning.pruning_module.PruningModule`).
:data:`STAGE_CALLBACKS` lists them in that order (``prune.py`` installs them so).
"""
from .export import ExportCallback
from .importance import ImportanceCallback
from .learning_rate import LearningRateCallback
from .report import ReportCallback
from .save_pruned import SavePrunedCallback
from .search import SearchCallback
from .splits import SplitsCallback

#: One callback per stage, in the pipeline's order (the stages run in that order whatever the list's).
STAGE_CALLBACKS = (ImportanceCallback, SearchCallback, SplitsCallback, ExportCallback, ReportCallback)

__all__ = ["ExportCallback", "ImportanceCallback", "LearningRateCallback", "ReportCallback", "STAGE_CALLBACKS", "SavePrunedCallback",
           "SearchCallback", "SplitsCallback"]
