"""Thin Lightning callbacks, one per pipeline stage; each calls into ``snapvit_pl``."""
from .correction import CorrectionCallback
from .evaluation import EvaluationCallback
from .export import PAPER_BUDGETS, ExportCallback
from .importance import ImportanceCallback
from .report import ReportCallback
from .search import SearchCallback

__all__ = ["CorrectionCallback", "EvaluationCallback", "ExportCallback", "ImportanceCallback", "PAPER_BUDGETS", "ReportCallback", "SearchCallback"]
