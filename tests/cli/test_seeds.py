"""Seeds (issue 36): every seed a user may set runs to the end, and a random-weights run is one chain that later
commands rebuild: ``extract`` cuts the same model files from its scores, ``evaluate`` measures the same numbers from
its config, ``train.py`` rebuilds the same base as its teacher, and ``pretrain`` takes its own seeds."""
import json
from pathlib import Path

import pytest
import yaml

from snapvit_pl.cli import main
from snapvit_pl.data import find_fashion_mnist
from snapvit_pl.elastic import ElasticScores

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(find_fashion_mnist(None) is None, reason="apt-get install dataset-fashion-mnist")]
TINY = ["--model.checkpoint_path=null", "--model.pretrained=false", "--model.model_kwargs.embed_dim=32",
        "--model.model_kwargs.depth=2", "--model.model_kwargs.num_heads=4", "--data.init_args.max_samples=48",
        "--data.init_args.batch_size=16", "--data.init_args.n_local_views=2", "--search.max_evaluations=4",
        "--search.num_images=32", "--search.batch_size=32", "--search.pca_components=8",
        "--export.budgets=[{flops: 0.6}]", "--report.print_table=false", "--progress=off"]
EVALUATION = ["--evaluation.metrics=[knn]", "--evaluation.train_samples=100", "--evaluation.val_samples=50",
              "--evaluation.knn_k=5"]


@pytest.mark.parametrize("option, weights_seed, data_seed", [
    ("--seed_everything=1", 1, 0), ("--data.init_args.seed=5", 0, 5), ("--model.seed=5", 5, 0)])
def test_a_seed_a_user_sets_runs_to_the_end_and_is_the_one_recorded(tmp_path, option, weights_seed, data_seed):
    """Each seed alone (the others at their defaults): exit 0 (these ended in Lightning's hparams-merge error), the
    weights seed the scores record, the data seed in the run's config."""
    run = tmp_path / "run"
    assert main(["prune", "--out_dir", str(run), *TINY, "--evaluation.metrics=[]", option]) == 0
    assert ElasticScores.load(run / "elastic_scores.safetensors").base["seed"] == weights_seed
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"]["init_args"]["seed"] == data_seed
    assert json.loads((run / "report.json").read_text())["model"]["seed"] == weights_seed


@pytest.fixture(scope="module")
def seeded_run(tmp_path_factory) -> Path:
    """``--model.pretrained false --seed_everything 3``: random weights of seed 3, a k-NN of the dense and the cut."""
    run = tmp_path_factory.mktemp("seeded") / "run"
    assert main(["prune", "--out_dir", str(run), *TINY, *EVALUATION, "--seed_everything=3"]) == 0
    return run


def test_extract_cuts_the_same_model_files_from_a_random_weights_run(seeded_run, tmp_path):
    assert main(["extract", "--scores", str(seeded_run / "elastic_scores.safetensors"), "--progress=off",
                 "--out_dir", str(tmp_path / "cut"), "--export.budgets=[{flops: 0.6}]"]) == 0
    cut, exported = tmp_path / "cut" / "flops0.6", seeded_run / "models" / "flops0.6"
    assert (cut / "model.safetensors").read_bytes() == (exported / "model.safetensors").read_bytes()
    records = [json.loads((folder / "architecture.json").read_text()) for folder in (cut, exported)]
    for record in records:  # what only prune.py measured (it evaluates), and the checksum that covers it
        record["extra"].pop("metrics", None), record["extra"].pop("evaluated_on", None), record.pop("sha256")
    assert records[0] == records[1]


def test_evaluate_measures_the_numbers_of_the_run(seeded_run, tmp_path, capsys):
    """From the run's config: the dense model (random weights rebuilt from the recorded seed) and the cut model
    give the k-NN accuracy report.json holds."""
    report = json.loads((seeded_run / "report.json").read_text())
    config = ["--config", str(seeded_run / "config.yaml"), "--device=cpu"]
    capsys.readouterr()
    assert main(["evaluate", *config]) == 0
    dense = json.loads(capsys.readouterr().out)
    assert main(["evaluate", *config, "--checkpoint", str(seeded_run / "models" / "flops0.6")]) == 0
    pruned = json.loads(capsys.readouterr().out)
    assert dense["knn_top1"] == report["dense"]["metrics"]["knn_top1"]
    assert pruned["knn_top1"] == report["pruned"][0]["metrics"]["knn_top1"]
    assert dense["params"] == report["dense"]["params"] and pruned["params"] == report["pruned"][0]["params"]


def test_train_rebuilds_the_random_base_as_its_teacher(seeded_run, tmp_path):
    """Distillation from the run's cut model: the teacher is the seed-3 base, rebuilt from the record (its
    fingerprint checked against the one prune.py recorded), and one step of fine-tuning exports a model."""
    from snapvit_pl.lightning.finetune_module import FinetuneModule
    from snapvit_pl.models import fingerprint

    checkpoint = seeded_run / "models" / "flops0.6"
    report = json.loads((seeded_run / "report.json").read_text())
    assert fingerprint(FinetuneModule(checkpoint=str(checkpoint), loss="both").teacher) == report["model"]["fingerprint"]
    out = tmp_path / "finetune"
    assert main(["train", "fit", "--config", str(ROOT / "configs" / "train" / "finetune_pruned.yaml"),
                 f"--model.checkpoint={checkpoint}", f"--trainer.default_root_dir={out}", "--trainer.max_steps=1",
                 "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false", "--trainer.accelerator=cpu",
                 "--data.init_args.batch_size=8", "--data.init_args.max_samples=64", "--seed_everything=3"]) == 0
    assert (out / "model" / "model.safetensors").is_file()


PRETRAIN = ["fit", "--config", "dino_fmnist", "--model.model_kwargs.embed_dim=32", "--model.model_kwargs.depth=2",
            "--model.model_kwargs.num_heads=4", "--model.out_dim=64", "--model.hidden_dim=32",
            "--model.bottleneck_dim=16", "--model.knn_train_samples=64", "--model.knn_val_samples=32",
            "--data.init_args.max_samples=64", "--data.init_args.batch_size=16", "--trainer.max_steps=2",
            "--trainer.enable_progress_bar=false"]


@pytest.mark.parametrize("option", ["--seed_everything=1", "--data.init_args.seed=5"])
def test_pretrain_takes_a_seed(tmp_path, option):
    out = tmp_path / "run"
    assert main(["pretrain", *PRETRAIN, f"--trainer.default_root_dir={out}",
                 f"--trainer.logger.init_args.save_dir={out}", option]) == 0
    assert (out / "model" / "model.safetensors").is_file()


def test_pretrain_refuses_global_view_counts_that_differ(tmp_path, capsys):
    """The teacher's inputs are the first model.n_global_views crops of the data's views: with the data's count
    apart, a local crop would become a teacher input. One line naming both settings; nothing written."""
    out = tmp_path / "run"
    code = main(["pretrain", *PRETRAIN, f"--trainer.default_root_dir={out}",
                 f"--trainer.logger.init_args.save_dir={out}", "--model.n_global_views=1"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert "model.n_global_views 1" in errors[0] and "data.init_args.n_global_views 2" in errors[0]
    assert not out.exists()


def test_each_accuracy_is_one_number_in_the_table_report_evaluate_and_tensorboard(seeded_run, capsys):
    """Issue 51: one unit per name. report.json, evaluate's JSON and TensorBoard hold the fraction under the metric's
    name; report.md's table shows it in percent under a label that says so (``k-NN %``), rounded to 2 decimals."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    report = json.loads((seeded_run / "report.json").read_text())
    assert main(["evaluate", "--config", str(seeded_run / "config.yaml"), "--device=cpu",
                 "--checkpoint", str(seeded_run / "models" / "flops0.6")]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    lines = (seeded_run / "report.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| model"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    rows = {r[0]: r for r in ([c.strip() for c in line.strip("|").split("|")] for line in lines
                              if line.startswith(("| dense", "| flops0.6")))}
    events = EventAccumulator(str(seeded_run / "tensorboard"))
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("models/knn_top1_vs_params")}
    for name, entry in (("dense", report["dense"]), ("flops0.6", report["pruned"][0])):
        value = entry["metrics"]["knn_top1"]
        assert 0 <= value <= 1
        assert float(rows[name][cells.index("k-NN %")]) == pytest.approx(100 * value, abs=0.005)
        assert logged[entry["params"]] == pytest.approx(value, abs=1e-6)
    assert evaluated["knn_top1"] == report["pruned"][0]["metrics"]["knn_top1"]
