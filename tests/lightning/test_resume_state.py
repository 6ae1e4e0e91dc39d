import pytest
import torch

from families import FAMILIES
from snapvit_pl.errors import CheckpointError, ConfigError
from snapvit_pl.lightning.pruning_module import PruningModule
from snapvit_pl.lightning.resume import (
    RESUME_FILE, changed_settings, check_resume, has_progress, restore_run, start_resume_state,
)

SAVED = """model:
  model_name: vit_tiny_patch16_224
  checkpoint_path: assets/a.safetensors
search:
  max_evaluations: 40
report:
  print_table: true
verbose: false
trainer:
  enable_progress_bar: true
"""


def test_only_overrides_that_change_the_result_are_refused():
    same_result = ["--report.print_table=false", "--trainer.enable_progress_bar", "false", "--search.max_evaluations=40"]
    assert changed_settings(SAVED, same_result) == []
    other = ["--model.checkpoint_path", "other.safetensors", "--search.max_evaluations=80", "--search.seed=3"]
    assert changed_settings(SAVED, other) == ["model.checkpoint_path", "search.max_evaluations", "search.seed"]
    with pytest.raises(ConfigError, match="--model.checkpoint_path, --search.max_evaluations, --search.seed would change"):
        check_resume(SAVED, other)
    check_resume(SAVED, same_result)


@pytest.fixture
def module():
    spec = FAMILIES["augreg_vit"]
    return PruningModule(spec.model_name, False, None, spec.model_kwargs)


def test_a_run_that_did_nothing_yet_resumes_afresh_and_is_not_progress(module, tmp_path):
    start_resume_state(tmp_path, module)
    assert (tmp_path / RESUME_FILE).exists() and not has_progress(tmp_path)
    state = torch.load(tmp_path / RESUME_FILE, weights_only=True)
    state["SearchCallback"] = {"optimizer": {"evaluations": 3}}
    torch.save(state, tmp_path / RESUME_FILE)
    assert has_progress(tmp_path)
    assert not has_progress(tmp_path / "nowhere")


def test_other_base_weights_are_refused_and_timings_come_back(module, tmp_path):
    start_resume_state(tmp_path, module)
    state = torch.load(tmp_path / RESUME_FILE, weights_only=True)
    state["run"]["timings"] = {"scoring_s": 12.5}
    state["run"]["elapsed_s"] = 30.0
    trainer = type("Trainer", (), {"callbacks": []})()
    restore_run(trainer, module, state)
    assert module.state.timings.scoring_s == 12.5 and module.state.elapsed() >= 30.0
    state["run"]["fingerprint"] = "0" * 64
    with pytest.raises(CheckpointError, match="base weights changed since the run started"):
        restore_run(trainer, module, state)
