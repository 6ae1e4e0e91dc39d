"""Thin Lightning callbacks, one per pipeline stage, installed as ``snapvit_pl.callbacks``.

Each hook calls one method of the module's :class:`snapvit_pl.pipeline.Pipeline`, which runs the stages
in the order of :data:`snapvit_pl.pipeline.STAGES` and refuses one before the stages it follows.
:data:`STAGE_CALLBACKS` lists them in that order (``prune.py`` installs them so).
"""
from .export import ExportCallback
from .importance import ImportanceCallback
from .report import ReportCallback
from .save_pruned import SavePrunedCallback
from .search import SearchCallback
from .splits import SplitsCallback

#: One callback per stage, in the pipeline's order (two share a hook: their order in the list is the stages').
STAGE_CALLBACKS = (ImportanceCallback, SearchCallback, SplitsCallback, ExportCallback, ReportCallback)

__all__ = ["ExportCallback", "ImportanceCallback", "ReportCallback", "STAGE_CALLBACKS", "SavePrunedCallback",
           "SearchCallback", "SplitsCallback"]
