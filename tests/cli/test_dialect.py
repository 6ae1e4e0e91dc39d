"""One command-line dialect for every command: the same option names, ``--config`` (any command's YAML) honoured in
full, ``--print_config``, ``--verbose`` as its help says, ``--resume`` overrides read by the parser itself."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from images import image_folder

from snapvit_pl.cli import main as snapvit_pl_main
from snapvit_pl.config_files import configs_first, merged_config
from snapvit_pl.models import load_pruned
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
    config, dino = _printed(capsys), merged_config(DINO)
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
    # with the run's data the split the run did not choose is raced as the run would have (issue 55): the same as
    # asking prune.py for it (without --config, the run's own images: tests/cli/test_extract.py)
    assert prune_main([*tiny_prune_args, "--data.init_args.max_samples=32", "--search.max_evaluations=0",
                       "--out_dir", str(tmp_path / "asked"), "--export.budgets=[{sparsity: 0.45}]"]) == 0
    asked = load_pruned(tmp_path / "asked" / "models" / "sparsity0.45")[1]["extra"]["requested_head_ratio"]
    assert load_pruned(tmp_path / "cut" / "sparsity0.45")[1]["extra"]["requested_head_ratio"] == pytest.approx(asked)
    bad = tmp_path / "extract.yaml"  # an extract config of its own still may not hold keys extract has not
    bad.write_text("export:\n  split: fitness\n")
    assert extract_main(["--config", str(bad), "--scores", "s", "--out_dir", str(tmp_path / "x")]) == 2
    assert "split" in capsys.readouterr().err


@pytest.mark.parametrize("group, error", [
    ("--search={num_images: abc}", "--search.num_images: expected an integer, got 'abc'"),
    ("--search={bogus: 1}", "--search.bogus: no such option"),
    ("--export={split_step: 2}", "export.split_step must be a number > 0 and < 1, got 2.0"),
])
def test_a_group_given_whole_is_checked_key_by_key(tiny_prune_args, tmp_path, capsys, group, error):
    assert prune_main([*tiny_prune_args, group]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {error}") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


FULL_SIZE = ("dino_vitb16", "deit_b16", "siglip2_b16", "dinov2_vitb14_reg", "dinov3_vits16")


@pytest.mark.parametrize("name", FULL_SIZE)
def test_a_full_size_preset_is_its_base_and_its_model(name, capsys, tmp_path):
    """Each full-size preset names its model and extends one shared base; read by name, it is the base's settings
    with the preset's over them (the base's data, scorer and budgets; the preset's model and metrics)."""
    preset = yaml.safe_load((ROOT / "configs" / "prune" / f"{name}.yaml").read_text())
    base = yaml.safe_load((ROOT / "configs" / "prune" / "base" / "imagenet.yaml").read_text())
    assert preset["base"] == "base/imagenet.yaml" and set(preset) <= {"base", "model", "evaluation"}
    with pytest.raises(SystemExit):
        prune_main(["--config", name, "--data.init_args.root", str(image_folder(tmp_path / "images")), "--print_config"])
    config = _printed(capsys)
    assert config["model"]["model_name"] == preset["model"]["model_name"]
    assert {k: config["model"]["model_kwargs"][k] for k in preset["model"]["model_kwargs"]} == preset["model"]["model_kwargs"]
    assert {k: config["data"]["init_args"][k] for k in base["data"]["init_args"] if k != "root"} == {
        k: v for k, v in base["data"]["init_args"].items() if k != "root"}
    scorer = base["importance"]["scorer"]
    assert config["importance"]["scorer"]["class_path"] == scorer["class_path"]
    assert {k: config["importance"]["scorer"]["init_args"][k] for k in scorer["init_args"]} == scorer["init_args"]
    assert config["evaluation"]["metrics"] == preset.get("evaluation", base["evaluation"])["metrics"]
    assert "base" not in config


def test_a_config_of_ones_own_extends_a_base_and_the_command_line_still_wins(tmp_path, capsys):
    """``base:`` is relative to the config's folder (or absolute, or a list: applied in order); an overlay after it
    (``--config quick``) and the command line override the layered file; the train commands layer too."""
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "sizes.yaml").write_text("search: {num_images: 40, batch_size: 20}\n")
    (tmp_path / "shared" / "data.yaml").write_text(f"base: {DINO}\ndata: {{init_args: {{max_samples: 77}}}}\n")
    mine = tmp_path / "mine.yaml"
    images = image_folder(tmp_path / "images")
    mine.write_text(f"base: [shared/data.yaml, shared/sizes.yaml]\nsearch: {{num_images: 50}}\n"
                    f"data: {{init_args: {{root: {images}}}}}\n")
    with pytest.raises(SystemExit):
        prune_main(["--config", str(mine), "--search.batch_size=10", "--print_config"])
    config = _printed(capsys)
    assert config["model"]["model_name"] == "vit_base_patch16_224.dino"  # DINO's, through its own base
    assert config["data"]["init_args"]["max_samples"] == 77 and config["data"]["init_args"]["source"] == "folder"
    assert (config["search"]["num_images"], config["search"]["batch_size"]) == (50, 10)
    with pytest.raises(SystemExit):
        prune_main(["--config", str(mine), "--config", "quick", "--print_config"])
    assert _printed(capsys)["search"]["num_images"] == 8
    assert merged_config(mine)["search"] == {"num_images": 50, "batch_size": 20, "pca_components": 192}

    train = tmp_path / "train.yaml"
    train.write_text(f"base: {ROOT / 'configs' / 'train' / 'finetune_pruned.yaml'}\ntrainer: {{max_epochs: 3}}\n")
    with pytest.raises(SystemExit):
        snapvit_pl_main(["train", "fit", "--config", str(train), "--print_config"])
    config = _printed(capsys)
    finetune = yaml.safe_load((ROOT / "configs" / "train" / "finetune_pruned.yaml").read_text())
    assert config["trainer"]["max_epochs"] == 3 and config["model"]["loss"] == finetune["model"]["loss"]
    assert config["trainer"]["gradient_clip_val"] == finetune["trainer"]["gradient_clip_val"]


@pytest.mark.parametrize("files, message", [
    ({"a.yaml": "base: b.yaml\n", "b.yaml": "base: a.yaml\n"}, "its base configs come back to"),
    ({"a.yaml": "base: missing.yaml\nsearch: {num_images: 8}\n"}, "its base missing.yaml is not a file"),
    ({"a.yaml": "base: {x: 1}\n"}, "base must be a file or a list of files"),
    ({"a.yaml": "base: b.yaml\n", "b.yaml": "search: [\n"}, "b.yaml is not valid YAML"),
    ({"a.yaml": "base: b.yaml\n", "b.yaml": "search: {num_imagez: 8}\n"}, "num_imagez"),
], ids=["cycle", "missing", "not-a-path", "bad-yaml", "unknown-key"])
def test_a_bad_base_is_one_error_line(files, message, tmp_path, capsys):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert prune_main(["--config", str(tmp_path / "a.yaml"), "--out_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run").exists()


def test_a_yaml_merge_key_is_valid_yaml_the_strict_reader_takes(tmp_path, capsys):
    """Issue 48: ``<<: *defaults`` inside a section was refused as "could not determine a constructor for the tag
    merge"; it merges (the section's own keys winning), while a key given twice is still refused."""
    from snapvit_pl.config_files import read_config

    (tmp_path / "merge.yaml").write_text("search:\n  <<: {max_evaluations: 4, num_images: 16}\n  num_images: 32\n")
    assert read_config(tmp_path / "merge.yaml")[1] == {"search": {"max_evaluations": 4, "num_images": 32}}
    with pytest.raises(SystemExit):
        evaluate_main(["--config", str(tmp_path / "merge.yaml"), "--checkpoint", "c", "--print_config"])
    (tmp_path / "twice.yaml").write_text("search:\n  num_images: 16\n  num_images: 32\n")
    with pytest.raises(ConfigError, match="given twice"):
        read_config(tmp_path / "twice.yaml")


def test_the_installed_command_names_itself_in_its_help_and_messages(capsys):
    """Issue 48: `snapvit-pl prune --help` said "usage: python prune.py", and its errors "see python prune.py"."""
    assert snapvit_pl_main(["prune", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: snapvit-pl prune ")
    assert snapvit_pl_main(["prune", "--serch.num_images=3"]) == 2
    assert "see snapvit-pl prune --help" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        snapvit_pl_main(["train", "fit", "--help"])
    assert capsys.readouterr().out.startswith("usage: snapvit-pl train ")


def test_non_ascii_paths_under_the_c_locale(tmp_path):
    """Issue 48: with LC_ALL=C and PYTHONUTF8=0, a non-ASCII --out_dir was a traceback, a non-ASCII data root (or
    scores file) refused; the command starts itself again in UTF-8 mode, where the same bytes name the same files."""
    from families import saved_scores

    folder = tmp_path / "donn\u00e9es"
    folder.mkdir()
    saved_scores(folder, "sc\u00f6res.safetensors")
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "OMP_NUM_THREADS": "1"}
    env.pop("LANG", None)
    result = subprocess.run([sys.executable, "-m", "snapvit_pl.extract", "--scores", str(folder / "sc\u00f6res.safetensors"),
                             "--out_dir", str(folder / "d\u00e9coup\u00e9"), "--export.budgets=[{flops: 0.5}]",
                             "--progress=off"], capture_output=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    assert (folder / "d\u00e9coup\u00e9" / "flops0.5" / "model.safetensors").is_file()
