"""The names of what a pruning run writes in its folder (one name per kind of file)."""
from __future__ import annotations

CONFIG_FILE = "config.yaml"
#: what an interrupted run leaves to continue from (:mod:`snapvit_pl.run.resume`)
RESUME_FILE = "resume_state.pt"
REPORT_FILE = "report.json"
REPORT_TEXT = "report.md"
SCORES_FILE = "elastic_scores.safetensors"
LATENCY_TABLE = "latency_table.json"
#: the run's lock (:class:`snapvit_pl.run.lock.DirectoryLock`)
LOCK_FILE = ".lock"
#: folders whose contents the run writes file by file (beside anything of the user's)
RUN_SUBFOLDERS = ("models", "plots", "tensorboard")
#: the report's figures, ``plots/<name>.png`` (:data:`snapvit_pl.pipeline.plots.FIGURES` draws them)
FIGURE_NAMES = ("accuracy_vs_params", "accuracy_vs_flops", "kept_units", "search_fitness")

#: what marks a folder as holding a run's results (besides the scores file, whose name a run may choose)
RESULT_FILES = (REPORT_FILE, SCORES_FILE, "models")
#: what a run folder holds besides the scores file (which must not take one of these names)
RUN_DIR_NAMES = (CONFIG_FILE, RESUME_FILE, REPORT_FILE, REPORT_TEXT, *RUN_SUBFOLDERS, LATENCY_TABLE, LOCK_FILE)
