"""The SnapViT method as plain-torch stages over a typed run state (no Lightning Trainer inside).

================  =============================  ===================================================
stage             settings                       functions
================  =============================  ===================================================
importance        :class:`ImportanceSettings`    :func:`local_importance` (or start /
                                                 ``scorer.update`` / finish)
search            :class:`SearchSettings`        :func:`run_search`
export            :class:`ExportSettings`,       :func:`choose_splits`, then :func:`extract_models`
                  :class:`CorrectionSettings`,   (cut -> correct -> evaluate -> save)
                  :class:`EvaluationSettings`
report            :class:`ReportSettings`        :func:`write_report`
================  =============================  ===================================================

:class:`RunState` carries what each stage hands to the next; :mod:`.stages` applies the stages to
it (what ``prune.py``'s callbacks call), and :func:`snapvit_pl.fit_elastic` strings them together
for Python users.
"""
from .extraction import (
    Correction, CorrectionSettings, Evaluation, EvaluationSettings, ExportSettings, check_budgets, extract_models,
)
from .importance import (
    ImportanceSettings, finish_importance, local_importance, prepare_pruning_data, scoring_views, start_importance,
)
from .report import ReportSettings, build_report, write_report
from .search import SearchProgress, SearchSettings, run_search, search_snapshots
from .splits import SplitChoice, choose_splits
from .stages import export_stage, finish_importance_stage, record_importance, search_stage
from .state import DenseModel, ExtractedModel, RunState, SearchResult, Timings

__all__ = [
    "Correction", "CorrectionSettings", "DenseModel", "Evaluation", "EvaluationSettings", "ExportSettings",
    "ExtractedModel", "ImportanceSettings", "ReportSettings", "RunState", "SearchProgress", "SearchResult",
    "SearchSettings", "SplitChoice", "Timings", "build_report", "check_budgets", "choose_splits", "export_stage", "extract_models", "finish_importance",
    "finish_importance_stage", "local_importance", "prepare_pruning_data", "record_importance", "run_search", "scoring_views", "search_snapshots", "search_stage",
    "start_importance", "write_report",
]
