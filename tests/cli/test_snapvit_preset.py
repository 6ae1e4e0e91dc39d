"""SnapViT's own recipe, ``configs/prune/snapvit.yaml`` (SSL-Fisher scores + the paper's xNES), end to end: it composes
with a model config, runs through prune.py, gives the single-process result on 2 processes, resumes byte for byte
after kill -9 in the middle of a search generation, and fit_elastic with the same settings gives the same scores."""
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import snapvit_pl
from run_helpers import digests, env, in_search, wait_for
from snapvit_pl.cli import prune_cli
from snapvit_pl.data import ClassificationDataModule, find_fashion_mnist
from snapvit_pl.elastic import ElasticScores
from snapvit_pl.models import BackboneSpec, load_backbone
from snapvit_pl.pipeline import ExportSettings
from snapvit_pl.scoring import SSLFisher

ROOT = Path(__file__).resolve().parents[2]
PRESET = ["--config", str(ROOT / "configs" / "prune" / "demo.yaml"), "--config", str(ROOT / "configs" / "prune" / "snapvit.yaml")]
EVALUATIONS = 30
SHRINK = [  # after the preset (the last value wins): a tiny random-weight model, a short search, few images
    "--model.checkpoint_path=null", "--model.model_kwargs.embed_dim=32", "--model.model_kwargs.depth=2",
    "--model.model_kwargs.num_heads=4", "--data.init_args.max_samples=48", "--data.init_args.n_local_views=2",
    f"--search.max_evaluations={EVALUATIONS}", "--search.num_images=256", "--search.batch_size=256",
    "--search.pca_components=8", "--export.budgets=[{flops: 0.6}]", "--export.split_grid=0",
    "--evaluation.metrics=[]", "--report.print_table=false", "--progress=off", "--trainer.accelerator=cpu",
]
needs_data = pytest.mark.skipif(find_fashion_mnist(None) is None, reason="apt-get install dataset-fashion-mnist")


def _prune_process(run: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "prune.py"), *PRESET, *SHRINK, "--out_dir", str(run), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env())


def _finish(process: subprocess.Popen) -> None:
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]


def test_the_preset_is_the_papers_method_and_composes_with_a_model_config(tmp_path):
    preset = yaml.safe_load((ROOT / "configs" / "prune" / "snapvit.yaml").read_text())
    assert snapvit_pl.SearchSettings(**preset["search"]) == snapvit_pl.SearchSettings.paper()  # one definition
    cli = prune_cli(["--config", str(ROOT / "configs" / "prune" / "dino_vitb16.yaml"), "--config",
                     str(ROOT / "configs" / "prune" / "snapvit.yaml"), "--out_dir", str(tmp_path / "run"),
                     "--model.pretrained=false", "--trainer.logger=false"])
    settings = cli.model.pipeline.settings
    assert isinstance(settings.importance.scorer, SSLFisher) and settings.search == snapvit_pl.SearchSettings.paper()
    assert cli.model.spec.model_name == "vit_base_patch16_224.dino"  # the model config's model, the preset's method
    assert (cli.datamodule.root, cli.datamodule.max_samples, cli.datamodule.batch_size) == ("data/imagenet", 1000, 16)


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    """The uninterrupted single-process run of the preset."""
    run = tmp_path_factory.mktemp("single") / "run"
    _finish(_prune_process(run))
    return run


@needs_data
@pytest.mark.slow
def test_prune_py_runs_the_preset(single):
    report = json.loads((single / "report.json").read_text())
    assert report["method"]["scorer"]["name"] == "ssl_fisher"
    search = report["method"]["search"]
    assert (search["optimizer"], search["parametrization"], search["initial_range"]) == ("xnes", "linear", [1.2, 0.8])
    assert report["search"]["evaluations"] == EVALUATIONS and report["search"]["best_fitness"] < report["search"]["initial_fitness"]
    scores = ElasticScores.load(single / "elastic_scores.safetensors")
    start = snapvit_pl.elastic.initial_coefficients(2, [4, 4], 1.2, 0.8)
    assert not torch.allclose(scores.coefficients, start)  # the search moved the coefficients


@needs_data
@pytest.mark.slow
def test_two_processes_give_the_single_process_result(single, tmp_path):
    _finish(_prune_process(tmp_path / "ddp", "--trainer.devices=2"))
    one, two = (ElasticScores.load(run / "elastic_scores.safetensors") for run in (single, tmp_path / "ddp"))
    for a, b in zip(one.neuron_scores + one.head_scores, two.neuron_scores + two.head_scores):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5 * float(a.abs().max()))
    torch.testing.assert_close(two.coefficients, one.coefficients, rtol=1e-5, atol=1e-6)
    report = json.loads((tmp_path / "ddp" / "report.json").read_text())
    assert sum(report["search"]["evaluations_per_rank"]) == EVALUATIONS and len(report["search"]["evaluations_per_rank"]) == 2


@needs_data
@pytest.mark.slow
def test_kill_9_in_the_middle_of_a_generation_resumes_byte_for_byte(single, tmp_path):
    run = tmp_path / "run"
    process = _prune_process(run)
    wait_for(run, process, in_search)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL
    resumed = subprocess.run([sys.executable, str(ROOT / "prune.py"), "--resume", str(run)], capture_output=True,
                             text=True, timeout=600, env=env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert digests(run) == digests(single)
    report = json.loads((run / "report.json").read_text())
    assert report["search"]["resumed_at"] and report["search"]["evaluations"] == EVALUATIONS


@needs_data
@pytest.mark.slow
def test_fit_elastic_with_the_preset_gives_the_scores_of_prune_py(single):
    cli_scores = ElasticScores.load(single / "elastic_scores.safetensors")
    torch.manual_seed(0)  # as prune.py's seed_everything(0) before it builds the random-weight model
    spec = BackboneSpec.from_dict(cli_scores.base)
    model = load_backbone(spec)
    dm = ClassificationDataModule(source="fashion_mnist", max_samples=48, batch_size=16, n_local_views=2, seed=0,
                                  train_views="multicrop")
    dm.configure_for_model(model)
    search = snapvit_pl.SearchSettings.paper(max_evaluations=EVALUATIONS, num_images=256, batch_size=256, pca_components=8)
    scores = snapvit_pl.fit_elastic(model, dm.train_dataloader(), scorer=SSLFisher(), search=search,
                                    export=ExportSettings(budgets=[{"flops": 0.6}], split_grid=0), spec=spec,
                                    fitness_images=dm.unlabeled_images(256, 256), progress=False)
    for a, b in zip(scores.head_scores + scores.neuron_scores, cli_scores.head_scores + cli_scores.neuron_scores):
        assert torch.equal(a, b)
    assert torch.equal(scores.coefficients, cli_scores.coefficients)
    assert scores.search["best_fitness"] == cli_scores.search["best_fitness"] and scores.splits == cli_scores.splits
