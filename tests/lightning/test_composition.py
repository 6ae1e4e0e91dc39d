"""The user's design as Lightning users compose it (issue 47): a ``PruningModule``, a DataModule and the stage callbacks
in a plain ``pl.Trainer``, without ``prune.py``'s wiring (``configure_pipeline`` optional): every callback, any order,
each one optional with a meaning, a user's own callback reading the scores, one and two processes; the scores are
``prune.py``'s for the same settings."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from compose import PRUNE_ARGS, compose
from snapvit_pl.callbacks import STAGE_CALLBACKS
from snapvit_pl.elastic import ElasticScores
from snapvit_pl.errors import ConfigError
from snapvit_pl.lightning.pruning_module import PruningModule

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(),
                                reason="apt-get install dataset-fashion-mnist")


@pytest.fixture(scope="module")
def prune_py(tmp_path_factory) -> ElasticScores:
    """The same run through ``prune.py``."""
    out = tmp_path_factory.mktemp("prune_py")
    done = subprocess.run([sys.executable, str(ROOT / "prune.py"), "--out_dir", str(out / "run"), *PRUNE_ARGS],
                          capture_output=True, text=True, cwd=out, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return ElasticScores.load(out / "run" / "elastic_scores.safetensors")


def same_scores(a: ElasticScores, b: ElasticScores) -> bool:
    return (all(torch.equal(x, y) for x, y in zip(a.head_scores, b.head_scores))
            and all(torch.equal(x, y) for x, y in zip(a.neuron_scores, b.neuron_scores))
            and a.splits == b.splits and a.fingerprint == b.fingerprint and a.settings == b.settings)


def test_a_plain_trainer_with_every_stage_callback_makes_prune_py_s_scores_and_models(prune_py, tmp_path):
    module = compose(tmp_path, reader=True)
    scores = ElasticScores.load(tmp_path / "elastic_scores.safetensors")
    assert same_scores(scores, prune_py)
    assert module.pipeline.state.completed == ["importance", "search", "splits", "export", "report"]
    assert (tmp_path / "models" / "flops0.6" / "model.safetensors").exists()
    report = json.loads((tmp_path / "report.json").read_text())
    assert "not_run" not in report and [m["label"] for m in report["pruned"]] == ["flops0.6"]
    # the user's own callback read the scores after the splits and cut a model from them
    read = json.loads((tmp_path / "reader.json").read_text())
    assert read["blocks"] == 2 and read["heads"] == [4, 4] and 0 < read["params"] < sum(
        p.numel() for p in module.backbone.parameters())


def test_without_the_search_callback_the_coefficients_stay_and_the_report_says_so(prune_py, tmp_path):
    module = compose(tmp_path, without="SearchCallback")
    assert module.pipeline.state.search is None and module.scores.coefficients is None
    assert "search" not in module.pipeline.state.completed
    assert json.loads((tmp_path / "report.json").read_text())["not_run"] == ["search"]
    assert "search (no SearchCallback: the block coefficients stay at their initial values)" in \
        (tmp_path / "report.md").read_text()
    assert same_scores(ElasticScores.load(tmp_path / "elastic_scores.safetensors"), prune_py)  # (no evaluations)


def test_without_the_export_callback_the_run_makes_the_scores_only(tmp_path):
    module = compose(tmp_path, without="ExportCallback")
    assert (tmp_path / "elastic_scores.safetensors").exists() and not (tmp_path / "models").exists()
    assert json.loads((tmp_path / "report.json").read_text())["not_run"] == ["export"]
    assert module.scores.extract(module.backbone, flops=0.6) is not None


def test_the_stages_run_in_the_pipeline_s_order_whatever_the_callbacks_order(monkeypatch, tmp_path):
    import compose as composed

    monkeypatch.setattr(composed, "STAGE_CALLBACKS", tuple(reversed(STAGE_CALLBACKS)))
    module = compose(tmp_path)
    assert module.pipeline.state.completed == ["importance", "search", "splits", "export", "report"]


@pytest.mark.slow
def test_two_processes_make_the_single_process_scores(prune_py, tmp_path):
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "compose.py"), str(tmp_path), "2"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert same_scores(ElasticScores.load(tmp_path / "elastic_scores.safetensors"), prune_py)
    assert (tmp_path / "models" / "flops0.6" / "model.safetensors").exists()


@pytest.mark.parametrize("options, message", [
    ({"strategy": "ddp"}, r"Trainer\(strategy=DDPStrategy\): .* pass strategy=snapvit_pl.lightning.strategy.PruningDDPStrategy"),
    ({"precision": "bf16-mixed"}, r"Trainer\(precision='bf16-mixed'\): each pruning stage picks its own precision"),
    ({"fast_dev_run": True}, r"Trainer\(fast_dev_run=True\): scores a share of the images .* fewer images \(max_samples\)"),
    ({"overfit_batches": 1}, r"Trainer\(overfit_batches=1\): scores a share of the images"),
    ({"limit_train_batches": 2}, r"Trainer\(limit_train_batches=2\): scores a share of the images"),
    ({"max_steps": 3}, r"Trainer\(max_steps=3\): scores a share of the images"),
    ({"max_epochs": 0}, r"Trainer\(max_epochs=0\): the run would stop before its importance pass, and no later stage"),
    ({"accumulate_grad_batches": 2}, r"Trainer\(accumulate_grad_batches=2\): a pruning run trains nothing .* nothing "
                                     r"accumulates"),
])
def test_trainer_settings_no_stage_can_honour_are_one_error(options, message):
    from compose import MODEL_KWARGS

    module = PruningModule("vit_tiny_patch16_224", pretrained=False, model_kwargs=MODEL_KWARGS, seed=0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, **options)
    module.trainer = trainer
    with pytest.raises(ConfigError, match=message):
        module.setup("fit")


def test_a_composed_run_into_a_finished_runs_folder_is_refused_before_any_epoch_unless_it_may_overwrite(tmp_path):
    """Issue 53: a second composed run into a finished run's folder left the first run's model beside its own
    (prune.py refused that folder); now the module holds its folder as prune.py does."""
    from snapvit_pl.errors import ConfigError

    compose(tmp_path)
    (tmp_path / "models" / "README.md").write_text("mine")
    first = sorted(p.name for p in (tmp_path / "models").iterdir())
    with pytest.raises(ConfigError, match="already holds results.*overwrite=True"):
        compose(tmp_path)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == first and not (tmp_path / ".lock").exists()
    compose(tmp_path, overwrite=True)
    assert (tmp_path / "models" / "README.md").read_text() == "mine" and not (tmp_path / ".lock").exists()


def test_without_the_importance_callback_the_run_is_refused_at_setup_before_any_epoch(tmp_path):
    """Issue 53: the Trainer ran its 1000 default epochs over the data for nothing before a traceback."""
    from snapvit_pl.errors import ConfigError

    with pytest.raises(ConfigError, match="no ImportanceCallback.*STAGE_CALLBACKS"):
        compose(tmp_path, without="ImportanceCallback")
    assert not (tmp_path / ".lock").exists()


def test_stage_callbacks_on_another_lightning_module_are_refused_at_setup(tmp_path):
    """Issue 53: stage callbacks on a LightningModule that is not a PruningModule. (A plain DataLoader and a
    DataModule of the user's own compose since issue 77: test_a_plain_loader_of_labelled_images_composes_end_to_end.)"""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from snapvit_pl.callbacks import STAGE_CALLBACKS
    from snapvit_pl.errors import ConfigError

    def trainer():
        return pl.Trainer(accelerator="cpu", callbacks=[c() for c in STAGE_CALLBACKS], logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                          use_distributed_sampler=False, max_epochs=1)

    loader = DataLoader(TensorDataset(torch.randn(8, 1, 28, 28)), batch_size=4)

    class Plain(pl.LightningModule):
        def training_step(self, batch, batch_idx):
            return None

        def configure_optimizers(self):
            return None

    with pytest.raises(ConfigError, match="ImportanceCallback runs a stage .* not on a Plain"):
        trainer().fit(Plain(), train_dataloaders=loader)


def test_the_scores_a_callback_sees_are_its_own_and_print_in_one_line(tmp_path):
    module = compose(tmp_path)
    scores = module.scores
    scores.head_scores[0].zero_()  # a user's callback changing what it was handed
    assert not torch.equal(module.scores.head_scores[0], scores.head_scores[0])  # the run's scores are unchanged
    text = repr(module.scores)
    assert "\n" not in text and len(text) < 200 and "blocks" in text and "heads" in text


def test_validate_test_and_a_second_fit_are_refused_in_the_project_s_words_and_fit_validates_nothing(tmp_path,
                                                                                                     monkeypatch):
    from compose import IMAGES

    from snapvit_pl.data import ClassificationDataModule
    from snapvit_pl.errors import ConfigError

    calls = []
    monkeypatch.setattr(PruningModule, "validation_step", lambda self, batch, i: calls.append(i))
    module = compose(tmp_path)  # its DataModule has a val split: nothing of it is read
    assert calls == []
    data = ClassificationDataModule(source="fashion_mnist", max_samples=IMAGES, batch_size=16, seed=0)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    for run in (trainer.validate, trainer.test):
        with pytest.raises(ConfigError, match=r"trainer\.(validate|test) on a PruningModule: .*snapvit-pl evaluate"):
            run(module, datamodule=data)
    with pytest.raises(ConfigError, match="run is finished .*configure_pipeline"):
        trainer.fit(module, datamodule=data)


def test_a_composed_run_on_lightning_s_defaults_is_as_quiet_as_prune_py_and_checkpoints_nothing(tmp_path):
    """Issue 53: a composed run printed what prune.py does not (no optimiser, no validation_step, modules in eval
    mode, the litlogger tip, the model summary, an epoch bar after the report); Lightning's default checkpoint wrote
    nothing and said nothing. Issue 77: a Trainer without max_epochs printed Lightning's "`max_epochs` was not set"
    notice, and the module's validation_step Lightning's "no `val_dataloader`" warning. Only what Lightning prints while the Trainer is built (before the module sees it) is
    left, and no checkpoint is made."""
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "lightning" / "compose.py"), str(tmp_path / "run"), "1",
                           "--plain"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # Lightning's lines in pl.Trainer(...), and the script's own pl.seed_everything
    built = ("GPU available", "TPU available", "HPU available", "Seed set to")
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert [line for line in lines if not line.startswith(built)] == []
    assert (tmp_path / "run" / "report.json").exists() and not list(tmp_path.rglob("*.ckpt"))


def test_a_model_checkpoint_of_the_user_s_is_refused_at_setup_and_lightning_s_default_is_taken_out():
    from compose import MODEL_KWARGS
    from pytorch_lightning.callbacks import ModelCheckpoint, ModelSummary

    module = PruningModule("vit_tiny_patch16_224", pretrained=False, model_kwargs=MODEL_KWARGS, seed=0)
    mine = ModelCheckpoint(save_last=True, every_n_epochs=1)
    module.trainer = pl.Trainer(accelerator="cpu", logger=False, callbacks=[*[c() for c in STAGE_CALLBACKS], mine])
    with pytest.raises(ConfigError, match="ModelCheckpoint on a PruningModule: a pruning run has nothing to checkpoint"):
        module.setup("fit")
    module.trainer = trainer = pl.Trainer(accelerator="cpu", logger=False, callbacks=[c() for c in STAGE_CALLBACKS])
    assert trainer.checkpoint_callback is not None and any(isinstance(c, ModelSummary) for c in trainer.callbacks)
    module.setup("fit")
    module.teardown("fit")
    assert trainer.checkpoint_callback is None and trainer.progress_bar_callback is None
    assert not any(isinstance(c, ModelSummary) for c in trainer.callbacks)


def test_the_trainer_options_prune_py_refuses_a_composed_trainer_refuses_in_the_same_words():
    from compose import MODEL_KWARGS

    from snapvit_pl.lightning.trainer_policy import check_options

    for option, value in [("fast_dev_run", True), ("limit_train_batches", 2), ("accumulate_grad_batches", 2)]:
        module = PruningModule("vit_tiny_patch16_224", pretrained=False, model_kwargs=MODEL_KWARGS, seed=0)
        module.trainer = pl.Trainer(accelerator="cpu", logger=False, **{option: value})
        with pytest.raises(ConfigError) as composed:
            module.setup("fit")
        with pytest.raises(ConfigError) as cli:
            check_options({option: value}, {}, cli=True)
        assert str(composed.value).split(": ", 1)[1] == str(cli.value).split(": ", 1)[1]
        assert str(composed.value).startswith(f"Trainer({option}=") and str(cli.value).startswith(f"--trainer.{option} ")


@pytest.mark.slow
def test_two_composed_runs_started_together_on_one_new_folder_one_runs_the_other_is_refused(tmp_path):
    """The composed Trainer reaches the same run-folder policy as prune.py and the Pipeline (whose test repeats the
    race: tests/run/test_folder.py); here, once, that a composed run is refused through it."""
    from together import run_together

    run = tmp_path / "run"
    command = [sys.executable, str(ROOT / "tests" / "lightning" / "compose.py"), str(run), "1", "--wait"]
    results = run_together([command, command], cwd=tmp_path)
    assert sorted(code == 0 for code, _ in results) == [False, True], [err[-2000:] for _, err in results]
    refused = next(err for code, err in results if code != 0)
    assert "ConfigError" in refused and ("in use by another run" in refused or "already holds results" in refused)
    assert json.loads((run / "report.json").read_text())["pruned"] and not (run / ".lock").exists()


@pytest.mark.parametrize("kind", ["csv", "own"])
def test_a_composed_run_logs_to_any_lightning_logger(tmp_path, kind):
    """Issue 77: a CSVLogger crashed the run at its end (the hyperparameters were passed with the metrics, as only
    TensorBoard's logger takes them). Lightning's logger interface as documented: ``log_hyperparams(params)`` and
    ``log_metrics(metrics, step)``; both get the run's numbers."""
    from pytorch_lightning.loggers import CSVLogger, Logger
    from pytorch_lightning.utilities import rank_zero_only

    class Recorder(Logger):  # the minimal logger of Lightning's documentation
        def __init__(self):
            super().__init__()
            self.params, self.metrics = [], []

        @property
        def name(self):
            return "recorder"

        @property
        def version(self):
            return "0"

        @rank_zero_only
        def log_hyperparams(self, params):
            self.params.append(params)

        @rank_zero_only
        def log_metrics(self, metrics, step=None):
            self.metrics.append(metrics)

    logger = CSVLogger(tmp_path / "logs") if kind == "csv" else Recorder()
    compose(tmp_path / "run", logger=logger, metrics=["knn"])
    assert (tmp_path / "run" / "report.json").is_file()
    if kind == "csv":
        hparams = (Path(logger.log_dir) / "hparams.yaml").read_text()
        columns = (Path(logger.log_dir) / "metrics.csv").read_text().splitlines()[0]
        assert "scorer: gn_greedy" in hparams and "dense/knn_top1" in columns and "flops0.6/knn_top1" in columns
    else:
        assert logger.params[-1]["scorer"] == "gn_greedy"
        assert {"dense/knn_top1", "flops0.6/knn_top1"} <= set(logger.metrics[-1])


@pytest.mark.parametrize("data_as", ["loader", "own_datamodule"])
def test_a_plain_loader_of_labelled_images_composes_end_to_end(tmp_path, data_as):
    """Issue 77: trainer.fit(module, train_dataloaders=loader) was refused. Any loader of images now runs the whole
    pipeline (importance, search, splits, export, evaluation) on its images, kept as the importance pass reads them:
    the fitness and calibration images first, and the evaluation's memory and scored images from its labels."""
    from compose import IMAGES

    module = compose(tmp_path / "run", metrics=["knn"], data_as=data_as)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [e["label"] for e in report["pruned"]] == ["flops0.6"]
    assert 0 <= report["dense"]["metrics"]["knn_top1"] <= 1 and 0 <= report["pruned"][0]["metrics"]["knn_top1"] <= 1
    inputs = module.pipeline.inputs
    assert inputs.kept == IMAGES and inputs.labeled  # every image once: the fitness's 49, then the evaluation's 20 + 20
    assert (tmp_path / "run" / "models" / "flops0.6" / "model.safetensors").is_file()


def test_a_loader_that_yields_no_images_is_refused_in_one_line(tmp_path):
    from torch.utils.data import DataLoader

    from compose import MODEL_KWARGS
    from snapvit_pl.errors import ConfigError

    module = PruningModule("vit_tiny_patch16_224", pretrained=False, model_kwargs=MODEL_KWARGS, seed=0)
    words = DataLoader([{"text": "a cat"}] * 8, batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", logger=False, callbacks=[c() for c in STAGE_CALLBACKS],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ConfigError, match=r"^the Trainer's loader yields dicts with keys \['text'\]; a pruning run "
                                          r"needs image tensors: \[B, C, H, W\] batches"):
        trainer.fit(module, train_dataloaders=words)


def test_a_plain_loader_on_several_processes_is_refused_and_given_inputs_are_kept():
    """Each process of a composed DDP run would read all of a plain loader (only the project's DataModules shard);
    images given to the pipeline by hand (TensorInputs) are kept rather than replaced by the loader's."""
    from compose import MODEL_KWARGS

    from snapvit_pl.errors import ConfigError
    from snapvit_pl.pipeline import Pipeline, TensorInputs
    from snapvit_pl.pipeline.data_source import check_data_source
    from snapvit_pl.pipeline.driver import Distributed

    module = PruningModule("vit_tiny_patch16_224", pretrained=False, model_kwargs=MODEL_KWARGS, seed=0)
    pipeline = Pipeline(module.backbone, dist=Distributed(rank=0, world_size=2))
    with pytest.raises(ConfigError, match="a plain loader on 2 processes: each would read all of its images"):
        check_data_source(pipeline, None)
    given = Pipeline(module.backbone, inputs=TensorInputs(torch.zeros(4, 1, 28, 28)), dist=Distributed(0, 2))
    assert check_data_source(given, None) is False  # (the callback then keeps its TensorInputs)
