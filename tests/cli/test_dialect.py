"""One command-line dialect for every command: the same option names, ``--config`` (any command's YAML) honoured in
full, ``--print_config``, ``--verbose`` as its help says, ``--resume`` overrides read by the parser itself."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from snapvit_pl.cli import main as snapvit_pl_main
from snapvit_pl.cli.common import configs_first
from snapvit_pl.cli.evaluate import main as evaluate_main
from snapvit_pl.cli.extract import main as extract_main
from snapvit_pl.cli.prune import prune_main
from snapvit_pl.data import find_fashion_mnist
from snapvit_pl.errors import ConfigError, PruningSpecError

ROOT = Path(__file__).resolve().parents[2]
DINO = ROOT / "configs" / "prune" / "dino_vitb16.yaml"


def _printed(capsys):
    return yaml.safe_load(capsys.readouterr().out)


def test_evaluate_reads_a_prune_config_in_full(capsys):
    """Its model, data and evaluation sections (the other sections, for pruning, are left out)."""
    with pytest.raises(SystemExit):
        evaluate_main(["--config", str(DINO), "--checkpoint", "runs/x/models/flops0.5", "--print_config"])
    config, dino = _printed(capsys), yaml.safe_load(DINO.read_text())
    assert config["data"]["class_path"] == dino["data"]["class_path"]
    assert {k: config["data"]["init_args"][k] for k in dino["data"]["init_args"]} == dino["data"]["init_args"]
    assert {k: config["evaluation"][k] for k in dino["evaluation"]} == dino["evaluation"]
    assert config["model"]["model_name"] == "vit_base_patch16_224.dino" and "search" not in config
    with pytest.raises(SystemExit):  # a command-line override wins over the config file
        evaluate_main(["--config", str(DINO), "--data.init_args.root=/data/imagenet", "--print_config"])
    assert _printed(capsys)["data"]["init_args"]["root"] == "/data/imagenet"


def test_extract_reads_a_prune_config_in_full(capsys):
    with pytest.raises(SystemExit):
        extract_main(["--config", str(DINO), "--scores", "s.safetensors", "--out_dir", "out", "--print_config"])
    config = _printed(capsys)
    assert config["data"]["init_args"]["root"] == "data/imagenet" and config["export"]["budgets"] is None
    assert config["correction"]["enabled"] is False and "search" not in config


def test_an_unknown_key_in_a_config_is_still_refused(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("evaluation:\n  metricz: [knn]\n")
    assert evaluate_main(["--config", str(bad), "--checkpoint", "x"]) == 2
    assert "metricz" in capsys.readouterr().err


def test_verbose_takes_true_false_or_nothing(tiny_prune_args, capsys):
    bad = [*tiny_prune_args, "--export.budgets=[{flop: 0.5}]"]
    assert prune_main([*bad, "--verbose", "false"]) == 2
    assert capsys.readouterr().err.startswith("error: --export.budgets: unknown budget key 'flop'")
    for verbose in (["--verbose", "true"], ["--verbose=true"], ["--verbose"]):
        with pytest.raises(ConfigError, match="did you mean 'flops'") as raised:  # the traceback
            prune_main([*bad, *verbose])
        causes, err = [], raised.value
        while err is not None:
            causes.append(type(err))
            err = err.__cause__ or err.__context__
        assert PruningSpecError in causes  # the budget's own refusal, where it was raised
    assert prune_main([*tiny_prune_args, "--verbose=maybe"]) == 2
    assert "--verbose takes true or false" in capsys.readouterr().err


@pytest.mark.skipif(find_fashion_mnist(None) is None, reason="apt-get install dataset-fashion-mnist")
def test_resume_overrides_are_compared_by_the_parser(tiny_prune_args, tmp_path, capsys):
    run = tmp_path / "run"
    args = [*tiny_prune_args, "--evaluation.metrics=[]", "--export.split=schedule"]
    assert prune_main(args) == 0
    (run / "report.json").unlink()  # as if the run had stopped before its report
    saved = yaml.safe_load((run / "config.yaml").read_text())["data"]["init_args"]["root"]
    assert prune_main(["--resume", str(run), "--data.root", "elsewhere"]) == 2  # the shorthand of data.init_args.root
    assert "--data.init_args.root would change what it computes" in capsys.readouterr().err
    assert prune_main(["--resume", str(run), "--data.root", saved, "--progress=off"]) == 0  # the saved value
    assert json.loads((run / "report.json").read_text())["search"]["resumed_at"] == 4


def test_the_snapvit_pl_command_runs_every_command(capsys):
    assert snapvit_pl_main(["--help"]) == 0
    usage = capsys.readouterr().out
    assert all(f"\n  {command} " in usage for command in ("prune", "train", "extract", "evaluate", "deploy", "hub"))
    assert snapvit_pl_main(["prunne"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown command 'prunne'")
    with pytest.raises(SystemExit):
        snapvit_pl_main(["extract", "--help"])
    assert "--export.budgets" in capsys.readouterr().out
    result = subprocess.run(["snapvit-pl", "hub", "card", "--checkpoint", "nowhere", "--repo", "org/name"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.startswith("error: ") and "Traceback" not in result.stderr


@pytest.mark.parametrize("command, options", [
    ("extract", ["--scores", "s.safetensors", "--out_dir", "out"]),
    ("evaluate", ["--checkpoint", "c"]),
    ("deploy", ["--checkpoint", "c", "--out", "m.onnx"]),
])
def test_every_command_prints_its_config_and_takes_it_back(command, options, tmp_path, capsys):
    with pytest.raises(SystemExit):
        snapvit_pl_main([command, *options, "--print_config"])
    printed = capsys.readouterr().out
    (tmp_path / "config.yaml").write_text(printed)
    with pytest.raises(SystemExit):
        snapvit_pl_main([command, "--config", str(tmp_path / "config.yaml"), "--print_config"])
    assert capsys.readouterr().out == printed


def test_options_before_a_config_override_it(capsys):
    """Wherever an option stands, it overrides every ``--config`` (jsonargparse would read it first and let the
    config win, or refuse ``--data.init_args.*`` before the config names the data class)."""
    for argv in (["--data.init_args.root=/data/x", "--config", str(DINO)], ["--config", str(DINO), "--data.init_args.root=/data/x"]):
        with pytest.raises(SystemExit):
            evaluate_main([*argv, "--checkpoint", "runs/x/models/flops0.5", "--print_config"])
        assert _printed(capsys)["data"]["init_args"]["root"] == "/data/x"
    assert configs_first(["fit", "--model.lr=1", "-c", "a.yaml", "--x", "1", "--config=b.yaml"]) == \
        ["fit", "-c", "a.yaml", "--config=b.yaml", "--model.lr=1", "--x", "1"]


def test_extract_takes_a_pruning_runs_config_as_its_help_says(tiny_prune_args, tmp_path, capsys):
    """The help's example: ``extract --config <run>/config.yaml --scores ...``; the run's export section holds
    prune.py's split settings, which extract does not have (left out, as whole sections are)."""
    assert prune_main([*tiny_prune_args, "--data.init_args.max_samples=32", "--search.max_evaluations=0"]) == 0
    run = tmp_path / "run"
    capsys.readouterr()
    assert extract_main(["--config", str(run / "config.yaml"), "--scores", str(run / "elastic_scores.safetensors"),
                         "--out_dir", str(tmp_path / "cut"), "--export.budgets=[{sparsity: 0.45}]"]) == 0
    assert (tmp_path / "cut" / "sparsity0.45").is_dir() and "sparsity0.45" in capsys.readouterr().out
    bad = tmp_path / "extract.yaml"  # an extract config of its own still may not hold keys extract has not
    bad.write_text("export:\n  split: fitness\n")
    assert extract_main(["--config", str(bad), "--scores", "s", "--out_dir", str(tmp_path / "x")]) == 2
    assert "split" in capsys.readouterr().err


@pytest.mark.parametrize("group, error", [
    ("--search={num_images: abc}", "--search.num_images: expected an integer, got 'abc'"),
    ("--search={bogus: 1}", "--search.bogus: no such option"),
    ("--export={split_step: 2}", "--export.split_step: 2 is out of range: must be > 0 and < 1"),
])
def test_a_group_given_whole_is_checked_key_by_key(tiny_prune_args, tmp_path, capsys, group, error):
    assert prune_main([*tiny_prune_args, group]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {error}") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()
