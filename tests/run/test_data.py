"""``Pipeline.from_run``: more budgets from a finished run folder in Python, raced on the run's own images as asking
``prune.py`` for them would have, and only on those (``snapvit_pl/run/data.py``)."""
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.torch import load_file

from snapvit_pl.cli.prune import prune_main
from snapvit_pl.errors import CheckpointError
from snapvit_pl.pipeline import Pipeline
from snapvit_pl.run.data import run_data

LATER = [{"sparsity": 0.45}]


def _cut(pipeline: Pipeline, out) -> tuple[dict, float]:
    (item,) = pipeline.export(LATER, models_dir=out, evaluate_dense=False)
    return load_file(out / item.label / "model.safetensors"), item.requested_head_ratio


def test_a_later_budget_from_a_run_folder_is_the_model_prune_py_cuts_when_asked(folder_run, tmp_path):
    run, data, args = folder_run
    assert prune_main([*args, "--out_dir", str(tmp_path / "asked"), "--export.budgets=[{sparsity: 0.45}]"]) == 0
    asked = load_file(tmp_path / "asked" / "models" / "sparsity0.45" / "model.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the run's images are taken: nothing to warn about
        pipeline = Pipeline.from_run(run, progress="off")  # the base model rebuilt from the spec the scores record
    pipeline.settings.evaluation.metrics = []
    cut, raced = _cut(pipeline, tmp_path / "cut")
    assert cut.keys() == asked.keys() and all(np.array_equal(cut[k].numpy(), asked[k].numpy()) for k in asked)

    interpolated, ratio = _cut(Pipeline.from_run(run, run_data=False, progress="off"), tmp_path / "plain")
    assert ratio != pytest.approx(raced)
    # every image the run read replaced: not taken, and a warning says why
    for path in sorted((data / "train").rglob("*.png")):
        Image.fromarray(np.random.default_rng(1).integers(0, 255, (28, 28), dtype=np.uint8)).save(path)
    with pytest.warns(UserWarning, match=r"the images of the run in .* are not taken because the images .* are not "
                                         r"those the run read \(32 of 32 files differ"):
        changed = Pipeline.from_run(run, progress="off")
    assert _cut(changed, tmp_path / "changed")[1] == pytest.approx(ratio)


def test_the_run_data_of_a_folder_that_cannot_give_its_images_is_none_and_why(folder_run, tmp_path):
    run, _, _ = folder_run
    scores = Pipeline.from_run(run, run_data=False, progress="off").elastic_scores()
    found = run_data(run, scores, 32)
    assert found.datamodule is not None and found.why_not == ""
    (run / "config.yaml").write_text("data: [not, a, section\n")  # edited since the run: its resume state refuses it
    assert "changed since the run started" in run_data(run, scores, 32).why_not
    (run / "resume_state.pt").unlink()
    assert run_data(run, scores, 32).why_not == f"there is no resume_state.pt (what the run read) in {run}"
    assert run_data(tmp_path / "elsewhere", scores, 32).why_not.startswith("there is no config.yaml in ")
    with pytest.raises(CheckpointError, match="elastic scores file not found"):
        Pipeline.from_run(tmp_path / "elsewhere")


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="apt-get install dataset-fashion-mnist")
def test_another_subset_of_the_same_source_files_is_not_the_runs_images(tiny_prune_args, tmp_path):
    """Issue 77: Fashion-MNIST is read from four IDX files, and the fingerprint held those files whole: a config
    edited to another data seed (other images of the same files) passed as the run's images and was raced on. The
    fingerprint records which samples were read; another seed reads others, and that is named."""
    from snapvit_pl.data import ClassificationDataModule
    from snapvit_pl.errors import DataError
    from snapvit_pl.run.data import images_the_run_read
    from snapvit_pl.run.resume import check_inputs, load_resume_state

    assert prune_main([*tiny_prune_args, "--search.max_evaluations=0", "--evaluation.metrics=[]",
                       "--export.budgets=[{flops: 0.6}]"]) == 0
    run = tmp_path / "run"
    scores = Pipeline.from_run(run, run_data=False, progress="off").elastic_scores()
    same = ClassificationDataModule(source="fashion_mnist", max_samples=48, batch_size=16)
    assert images_the_run_read(run, scores, same, 32) == ""
    other = ClassificationDataModule(source="fashion_mnist", max_samples=48, batch_size=16, seed=1)
    assert images_the_run_read(run, scores, other, 32, "the images given") == (
        "the images given are not those the run read (other samples of the same files: the data's seed or max_samples "
        "differ)")
    recorded = load_resume_state(run)["inputs"]
    with pytest.raises(DataError, match="other samples of the same files"):
        check_inputs(recorded, other.input_fingerprint([32]))
