"""Thin Lightning callbacks, one per pipeline stage, installed as ``snapvit_pl.callbacks``.

Each hook calls one function of :mod:`snapvit_pl.pipeline`; the stages run at fixed points of
``trainer.fit`` (see :mod:`snapvit_pl.lightning.pruning_module`), whatever order they are listed in.
"""
from .export import ExportCallback
from .importance import ImportanceCallback
from .report import ReportCallback
from .save_pruned import SavePrunedCallback
from .search import SearchCallback

__all__ = ["ExportCallback", "ImportanceCallback", "ReportCallback", "SavePrunedCallback", "SearchCallback"]
