import os

import numpy as np
import pytest
import torch
from PIL import Image

from families import FAMILIES
from snapvit_pl.data import ClassificationDataModule
from snapvit_pl.errors import CheckpointError, DataError
from snapvit_pl.models import load_backbone
from snapvit_pl.pipeline import ImportanceSettings, Pipeline, PipelineSettings, SearchSettings, TensorInputs
from snapvit_pl.pipeline.data_source import record_inputs
from snapvit_pl.run.names import RESUME_FILE
from snapvit_pl.run.resume import has_progress, load_resume_state
from snapvit_pl.scoring import Magnitude


@pytest.fixture
def model():
    torch.manual_seed(0)
    return load_backbone(FAMILIES["augreg_vit"])


def _pipeline(model, run_dir, evaluations=4):
    settings = PipelineSettings(importance=ImportanceSettings(Magnitude()),
                                search=SearchSettings(max_evaluations=evaluations, popsize=2, num_images=8,
                                                      pca_components=4, batch_size=8))
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return Pipeline(model, settings, inputs=TensorInputs(images), run_dir=run_dir, progress="off")


def test_a_run_that_did_nothing_yet_is_not_progress(model, tmp_path):
    pipeline = _pipeline(model, tmp_path)
    pipeline.save_progress()
    assert (tmp_path / RESUME_FILE).exists() and not has_progress(tmp_path)
    pipeline.importance([])
    assert has_progress(tmp_path) and load_resume_state(tmp_path)["local"] is not None
    assert not has_progress(tmp_path / "nowhere")


def test_a_resumed_pipeline_continues_to_the_uninterrupted_result(model, tmp_path):
    reference = _pipeline(model, tmp_path / "reference", evaluations=8)
    expected = reference.run()
    partial = _pipeline(model, tmp_path / "run", evaluations=4)  # an interrupted run: 4 of 8 evaluations
    partial.importance([])
    partial.search()
    partial.close()  # (interrupted: its process gave the folder up)
    state = load_resume_state(tmp_path / "run")
    state["timings"]["scoring_s"] = 12.5
    resumed = _pipeline(model, tmp_path / "run", evaluations=8)
    resumed.load_state_dict(state)
    assert resumed.completed("importance") and resumed.state.timings.scoring_s == 12.5
    scores = resumed.run()  # the importance pass is skipped, the search continues from evaluation 4
    assert resumed.state.search.resumed_at == 4 and torch.equal(scores.coefficients, expected.coefficients)


def test_a_resumed_run_reports_what_the_scorer_chose_as_the_uninterrupted_run_does(model, tmp_path):
    """The importance pass is skipped on resume, so what the scorer chose for itself at setup (``gram: auto``
    resolved) comes from the resume state: the scores' settings (and so the scores file) are the same."""
    from snapvit_pl.scoring import GaussNewtonGreedy

    def pipeline(run_dir):
        settings = PipelineSettings(importance=ImportanceSettings(GaussNewtonGreedy(probes=1, gram="auto")),
                                    search=SearchSettings(max_evaluations=0))
        images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
        return Pipeline(model, settings, inputs=TensorInputs(images), run_dir=run_dir, progress="off")

    uninterrupted = pipeline(tmp_path / "run")
    uninterrupted.importance([torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))])
    assert uninterrupted.state.method["scorer"]["gram_used"] == "full"
    uninterrupted.close()
    resumed = pipeline(tmp_path / "run")
    resumed.load_state_dict(load_resume_state(tmp_path / "run"))
    assert resumed.completed("importance") and resumed.state.method == uninterrupted.state.method


def test_other_base_weights_are_refused(model, tmp_path):
    pipeline = _pipeline(model, tmp_path)
    state = pipeline.state_dict()
    state["fingerprint"] = "0" * 64
    with pytest.raises(CheckpointError, match="base weights changed since the run started"):
        pipeline.load_state_dict(state)


def test_stages_refuse_to_run_out_of_order(model, tmp_path):
    pipeline = _pipeline(model, tmp_path)
    with pytest.raises(RuntimeError, match="after importance"):
        pipeline.search()
    pipeline.importance([])
    with pytest.raises(RuntimeError, match="after search, splits"):
        pipeline.export()


def test_a_damaged_resume_state_is_refused(model, tmp_path):
    from faults import flipped_copies
    from snapvit_pl.io import content_digest

    pipeline = _pipeline(model, tmp_path)
    pipeline.importance([])
    expected = load_resume_state(tmp_path)
    for position in flipped_copies(tmp_path / RESUME_FILE, count=30):
        try:
            state = load_resume_state(tmp_path)
        except CheckpointError as err:
            assert "start the run again" in str(err)
            continue
        assert content_digest(state) == content_digest(expected), position  # only a harmless flip (zip metadata)
    torch.save({**expected, "timings": {"scoring_s": 1.0}}, tmp_path / RESUME_FILE)  # rewritten without its checksum
    with pytest.raises(CheckpointError, match="carries no checksum"):
        load_resume_state(tmp_path)


def test_a_resume_refuses_a_config_edited_since_the_run_started(model, tmp_path):
    pipeline = _pipeline(model, tmp_path)
    pipeline.hold_folder()  # as prune.py does: the folder taken, then its config written
    (tmp_path / "config.yaml").write_text("search:\n  max_evaluations: 4\n")
    pipeline.importance([])
    assert load_resume_state(tmp_path)["local"] is not None
    (tmp_path / "config.yaml").write_text("search:\n  max_evaluations: 5\n")
    with pytest.raises(CheckpointError, match="config.yaml changed since the run started"):
        load_resume_state(tmp_path)


class _Pickled:
    """Any class: a resume state holding an instance needs unpickling (code) to read."""


def test_a_pickled_resume_state_is_refused_in_the_projects_words(tmp_path):
    torch.save({"local": _Pickled()}, tmp_path / "resume_state.pt")
    with pytest.raises(CheckpointError) as raised:
        load_resume_state(tmp_path)
    message = str(raised.value)
    assert "holds pickled Python objects, which snapvit-pl never loads" in message and "weights_only" not in message


@pytest.mark.parametrize("field, value, message", [
    ("local", {"heads": [torch.ones(3), torch.ones(4)], "neurons": [torch.ones(8), torch.ones(8)]}, "local.heads"),
    ("local", {"heads": "abc", "neurons": []}, "local.heads is 'abc'"),
    ("timings", {"warp_s": 1.0}, "timings is {'warp_s': 1.0}"),
    ("elapsed_s", "abc", "elapsed_s is 'abc'"),
    ("peak_memory_mb", {"cpu": float("nan")}, "peak_memory_mb"),
    ("search", {"optimizer": 3, "initial_fitness": 0.5}, "search is 'dict'"),
    ("inputs", {"split": "train", "listed": 1, "files": [["a.png", 0, 10, 0, "ab"]]}, "inputs is 'dict'"),
    ("inputs", [["a.png"]], "inputs is 'list'"),
    ("scorer_choices", {"gram_used": 3}, "scorer_choices is {'gram_used': 3}"),
    ("scorer_choices", ["full"], "scorer_choices is ['full']"),
])
def test_a_resume_state_that_breaks_its_schema_is_refused_naming_the_field(field, value, message):
    from snapvit_pl.run.resume import check_resume_state

    widths = {"heads": [4, 4], "mlp_hidden": [8, 8]}
    stages = ["scoring_s", "search_s"]
    check_resume_state({"local": {"heads": [torch.ones(4)] * 2, "neurons": [[0.5] * 8] * 2}}, widths, stages, "state.pt")
    with pytest.raises(CheckpointError) as raised:
        check_resume_state({field: value}, widths, stages, "state.pt")
    assert str(raised.value).startswith(f"state.pt: {message}") and "start the run again" in str(raised.value)


def _image_folder(root, per_class=6):
    """root/{train,val}/{a,b}: 8x8 grayscale PNGs, every file distinct."""
    for split, count in (("train", per_class), ("val", 2)):
        for c, value in (("a", 20), ("b", 150)):
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.fromarray(np.full((8, 8), value + i + 50 * (split == "val"), np.uint8)).save(
                    root / split / c / f"{i}.png")
    return root


def _interrupted(model, tmp_path, root):
    """A run over the image folder ``root`` that recorded its inputs and saved its local scores."""
    pipeline = _pipeline(model, tmp_path / "run")
    record_inputs(pipeline, ClassificationDataModule("folder", str(root), max_samples=4))
    pipeline.importance([])  # (Magnitude: no data) the search's 8 fitness images are what the scores depend on
    return load_resume_state(tmp_path / "run")


def _resume(model, tmp_path, root, state):
    resumed = _pipeline(model, tmp_path / "run")
    record_inputs(resumed, ClassificationDataModule("folder", str(root), max_samples=4))
    resumed.load_state_dict(state)
    return resumed


def test_a_resume_on_other_images_is_refused(model, tmp_path):
    root = _image_folder(tmp_path / "data")
    state = _interrupted(model, tmp_path, root)
    assert len(state["inputs"]["files"]) == 8 and state["inputs"]["listed"] == 12
    noise = np.random.default_rng(0)
    for path in (root / "train").rglob("*.png"):  # every image replaced with noise
        Image.fromarray(noise.integers(0, 255, (8, 8), dtype=np.uint8)).save(path)
    with pytest.raises(DataError) as raised:
        _resume(model, tmp_path, root, state)
    message = str(raised.value)
    assert message.startswith("--resume: the pruning images changed since the run was interrupted (8 of 8 files "
                              "differ, e.g. ") and "start a new run (another --out_dir)" in message, message
    assert "\n" not in message and "lists" not in message
    Image.fromarray(noise.integers(0, 255, (8, 8), dtype=np.uint8)).save(root / "train" / "a" / "extra.png")
    with pytest.raises(DataError, match=r"the train split lists 13 images, 12 then, and the seeded subset"):
        _resume(model, tmp_path, root, state)  # an image added where the subset is drawn from


def test_a_resume_after_changes_to_what_it_does_not_read_is_accepted(model, tmp_path):
    root = _image_folder(tmp_path / "data", per_class=8)
    state = _interrupted(model, tmp_path, root)
    read = {path for path, *_ in state["inputs"]["files"]}
    unread = sorted(str(p) for p in (root / "train").rglob("*.png") if str(p) not in read)
    assert len(read) == 8 and unread  # the search's 8 of the 16 training images
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(unread[0])  # an image outside the subset, replaced
    (root / "train" / "a" / "notes.txt").write_text("not an image")  # unrelated files
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "val" / "a" / "new.png")  # the val split: not read
    (root / "test").mkdir()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "test" / "x.png")
    first = sorted(read)[0]
    os.utime(first, ns=(0, 0))  # touched: the same bytes
    resumed = _resume(model, tmp_path, root, state)
    assert resumed.completed("importance") and resumed.state.inputs["files"][0][3] != state["inputs"]["files"][0][3]


def test_a_state_without_an_input_fingerprint(model, tmp_path):
    root = _image_folder(tmp_path / "data")
    state = _interrupted(model, tmp_path, root)
    with pytest.raises(DataError, match="recorded no fingerprint of its pruning images"):
        _resume(model, tmp_path, root, {**state, "inputs": None})  # it kept scores computed on unknown images
    _resume(model, tmp_path, root, {**state, "inputs": None, "local": None})  # it kept nothing: no risk
    _pipeline(model, tmp_path / "api").load_state_dict(state)  # no data module (tensors): nothing to compare
