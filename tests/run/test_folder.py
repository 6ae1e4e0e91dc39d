"""Issue 53: a :class:`Pipeline` given a run folder holds it as ``prune.py`` and a composed Trainer do (one policy,
:class:`snapvit_pl.run.folder.RunFolder`): taken before any work, one run at a time whatever the timing, an
earlier run's results replaced only with consent and then nothing of the user's, nothing left by a failed start."""
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from families import FAMILIES
from together import run_together
from snapvit_pl.errors import ConfigError
from snapvit_pl.models import load_backbone
from snapvit_pl.eval import EvaluationSettings
from snapvit_pl.pipeline import (ExportSettings, ImportanceSettings, Pipeline, PipelineSettings, ReportSettings,
                                 SearchSettings, TensorInputs)
from snapvit_pl.run.folder import RunFolder
from snapvit_pl.scoring import Magnitude

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model():
    return load_backbone(FAMILIES["augreg_vit"])


def _pipeline(model, run_dir, **options):
    settings = PipelineSettings(
        importance=ImportanceSettings(Magnitude()),
        search=SearchSettings(max_evaluations=0, num_images=8, pca_components=4, batch_size=8),
        export=ExportSettings(budgets=[{"flops": 0.6}], split_grid=0, split_candidates=3),
        evaluation=EvaluationSettings(metrics=[]), report=ReportSettings(print_table=False, plots=False))
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return Pipeline(model, settings, inputs=TensorInputs(images), run_dir=run_dir, progress="off", **options)


def _finish(pipeline):
    pipeline.run()
    pipeline.export()
    pipeline.report()


def test_a_folder_another_pipeline_holds_is_refused_before_any_work_and_free_once_given_up(model, tmp_path):
    first = _pipeline(model, tmp_path / "run")
    first.hold_folder()
    second = _pipeline(model, tmp_path / "run")
    with pytest.raises(ConfigError, match=r"is in use by another run .*choose another run_dir"):
        second.run()
    assert not second.completed("importance")  # refused before the importance pass
    first.run()
    first.close()
    with pytest.raises(ConfigError, match=r"holds an interrupted run .*pass overwrite=True"):
        _pipeline(model, tmp_path / "run").run()  # (scores and progress, no report yet)
    first.export()  # (takes its folder again)
    first.report()
    first.close()
    with pytest.raises(ConfigError, match=r"already holds results .*pass overwrite=True"):
        _pipeline(model, tmp_path / "run").run()


def test_overwrite_replaces_the_earlier_run_and_keeps_the_users_files(model, tmp_path):
    run = tmp_path / "run"
    with _pipeline(model, run) as pipeline:
        _finish(pipeline)
    (run / "notes.txt").write_text("mine")
    (run / "plots").mkdir(exist_ok=True)
    (run / "plots" / "my_figure.txt").write_text("mine too")
    earlier = (run / "report.json").stat().st_mtime_ns
    with _pipeline(model, run, overwrite=True) as pipeline:
        _finish(pipeline)
    assert (run / "notes.txt").read_text() == "mine" and (run / "plots" / "my_figure.txt").read_text() == "mine too"
    assert (run / "report.json").stat().st_mtime_ns != earlier and not (run / ".lock").exists()


def test_a_run_that_fails_before_it_saved_progress_leaves_nothing_and_one_that_saved_some_keeps_it(model, tmp_path):
    with pytest.raises(RuntimeError, match="user's bug"):
        with _pipeline(model, tmp_path / "new"):
            raise RuntimeError("user's bug")
    assert not (tmp_path / "new").exists()  # the folder it made goes with it
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="later bug"):
        with _pipeline(model, kept, overwrite=True) as pipeline:
            pipeline.importance([])  # the local scores: progress a resume continues from
            raise RuntimeError("later bug")
    assert (kept / "mine.txt").read_text() == "mine" and (kept / "resume_state.pt").exists()


def test_a_run_folder_taken_again_by_its_own_pipeline_is_not_refused(model, tmp_path):
    pipeline = _pipeline(model, tmp_path / "run")
    pipeline.run()
    pipeline.close()
    pipeline.export()  # taken again: its own results are no earlier run's
    pipeline.report()
    assert (tmp_path / "run" / "report.json").exists()


def test_a_caller_held_folder_is_used_as_it_is(model, tmp_path):
    with RunFolder(tmp_path / "run") as folder:
        pipeline = _pipeline(model, folder)
        pipeline.run()
        assert folder.held and pipeline.run_dir == folder.path
    assert not folder.held


RACE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from families import FAMILIES
    from snapvit_pl.models import load_backbone
    sys.path[:0] = [{here!r}, {root!r}]
    from test_folder import _finish, _pipeline
    from snapvit_pl.errors import ConfigError
    model = load_backbone(FAMILIES["augreg_vit"])
    print("ready", flush=True)
    sys.stdin.readline()  # the start signal: both processes begin in the same instant
    try:
        with _pipeline(model, sys.argv[1]) as pipeline:
            _finish(pipeline)
    except ConfigError as err:
        print("error:", err, file=sys.stderr)
        sys.exit(2)
""")


@pytest.mark.slow
# Three times (a race shows only sometimes). prune.py and a composed Trainer reach this same policy and race once
# each (tests/cli/test_run_folder.py, tests/lightning/test_composition.py).
@pytest.mark.parametrize("pair", range(3))
def test_two_pipelines_started_together_on_one_new_folder_one_runs_the_other_is_refused(tmp_path, pair):
    run = tmp_path / "run"
    code = RACE.format(tests=str(ROOT / "tests" / "models"), here=str(Path(__file__).parent), root=str(ROOT / "tests"))
    results = run_together([[sys.executable, "-c", code, str(run)]] * 2)
    assert sorted(code for code, _ in results) == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert refused.count("error:") == 1 and ("in use by another run" in refused or "already holds results" in refused)
    assert (run / "report.json").exists() and not (run / ".lock").exists()  # the first run's, complete


def test_the_figures_a_run_draws_are_the_figures_its_folder_names():
    """An overwrite removes ``plots/<name>.png`` for each name of :data:`FIGURE_NAMES` (run/names.py, torch-free);
    the report draws :data:`FIGURES` (pipeline/plots.py): one list."""
    from snapvit_pl.pipeline.plots import FIGURES
    from snapvit_pl.run.names import FIGURE_NAMES

    assert tuple(FIGURES) == FIGURE_NAMES
