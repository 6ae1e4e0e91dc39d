"""The SnapViT method as plain-torch stages over a typed run state (no Lightning Trainer inside).

================  =====================================  ==============================================
stage             settings (``prune.py`` YAML group)     what runs it
================  =====================================  ==============================================
importance        :class:`ImportanceSettings`            :meth:`Pipeline.importance` (or ``start_importance``
                  (``importance``)                       / ``importance_step`` / ``finish_importance``)
search            :class:`SearchSettings` (``search``)   :meth:`Pipeline.search` (:func:`run_search`)
splits            :class:`ExportSettings` (``export``)   :meth:`Pipeline.choose_splits` (:func:`choose_splits`)
export            ``export``, :class:`CorrectionSettings`  :meth:`Pipeline.export` (:func:`extract_models`:
                  (``correction``),                      cut -> correct -> evaluate -> save)
                  :class:`EvaluationSettings`
                  (``evaluation``)
report            :class:`ReportSettings` (``report``)   :meth:`Pipeline.report` (:func:`write_report`)
================  =====================================  ==============================================

:class:`Pipeline` (:mod:`.driver`) is the one driver: it runs the stages in this order over one
:class:`RunState`. :func:`snapvit_pl.fit_elastic`, ``prune.py``'s callbacks and ``python -m
snapvit_pl.extract`` are its callers.
"""
from ..correction import CorrectionSettings
from ..eval.suite import EvaluationSettings
from ..search import SearchProgress, SearchResult, SearchSettings, run_search, search_snapshots
from .driver import STAGES, Distributed, Pipeline, RunEvents
from .extraction import Correction, Evaluation, check_budgets, extract_models
from .importance import ImportancePass, local_importance, prepare_pruning_data, scoring_views
from .inputs import DataModuleInputs, StageInputs, TensorInputs
from .report import build_report, write_report
from .settings import ExportSettings, ImportanceSettings, PipelineSettings, ReportSettings
from .splits import SplitChoice, choose_splits, split_table
from .state import DenseModel, ExtractedModel, RunState, Timings

__all__ = [
    "STAGES", "Correction", "CorrectionSettings", "DataModuleInputs", "DenseModel", "Distributed", "Evaluation",
    "EvaluationSettings", "ExportSettings", "ExtractedModel", "ImportancePass", "ImportanceSettings", "Pipeline",
    "PipelineSettings",
    "ReportSettings", "RunEvents", "RunState", "SearchProgress", "SearchResult", "SearchSettings", "SplitChoice",
    "StageInputs", "TensorInputs", "Timings", "build_report", "check_budgets", "choose_splits", "extract_models",
    "local_importance", "prepare_pruning_data", "run_search", "scoring_views", "search_snapshots", "split_table",
    "write_report",
]
