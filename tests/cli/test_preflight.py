"""What prune.py refuses before it imports torch: unknown options and missing paths, one ``error:`` line within
seconds, before any weights are loaded or downloaded."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from snapvit_pl.cli.help import load_options
from snapvit_pl.errors import ConfigError
from snapvit_pl.cli.preflight import check_option_names, settings_in_effect

ROOT = Path(__file__).resolve().parents[2]
#: prune_main in a fresh interpreter; prints its status and whether torch was imported.
RUN = "import sys; from snapvit_pl.cli import prune_main; status = prune_main(sys.argv[1:]); print(status, 'torch' in sys.modules)"


def _prune(args, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_ENDPOINT="http://127.0.0.1:9")  # no Hub, no cache
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, cwd=tmp_path, env=env)
    return result, time.perf_counter() - started


def test_a_missing_data_root_without_network_is_one_line_before_any_hub_access(tmp_path):
    """The README's step 1 with a data root that does not exist, no network and no Hugging Face cache."""
    root = tmp_path / "imagenet"
    result, seconds = _prune(["--config", str(ROOT / "configs" / "prune" / "dino_vitb16.yaml"),
                              "--data.init_args.root", str(root), "--export.budgets", "[{flops: 0.5}]",
                              "--out_dir", "runs/prune/dino"], tmp_path)
    assert result.stdout.split() == ["2", "False"], result.stderr[-2000:]  # exit 2, torch never imported
    assert result.stderr.splitlines() == [result.stderr.strip()] and result.stderr.startswith(
        f"error: image folder root {root} does not exist")
    assert seconds < 5 and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, message", [
    (["--search.max_evaluationz=3"], "error: --search.max_evaluationz: no such option; did you mean "
                                     "--search.max_evaluations?"),
    (["--model.checkpoint_path", "missing.safetensors"], "error: checkpoint file not found: missing.safetensors"),
])
def test_typos_and_missing_files_are_refused_before_torch(tmp_path, args, message):
    result, _ = _prune(args, tmp_path)
    assert result.stdout.split() == ["2", "False"] and result.stderr.startswith(message), result.stderr[-2000:]


def test_a_config_given_as_yaml_text_longer_than_a_file_name_is_read_as_yaml(tmp_path):
    """``--config '<inline YAML>'`` longer than the system's file-name limit was taken for a path and failed with
    ``File name too long``; it is YAML text, read by the early checks and by the parser alike."""
    text = "{search: {num_images: 8, seed: 3}, report: {print_table: false}, " + " " * 300 + "}"
    assert settings_in_effect(["--config", text])["search.num_images"] == 8
    result, _ = _prune(["--config", text, "--search.max_evaluationz=3"], tmp_path)  # read, then the typo refused
    assert result.stdout.split() == ["2", "False"] and result.stderr.startswith(
        "error: --search.max_evaluationz: no such option"), result.stderr[-2000:]
    from snapvit_pl.config_files import resolve_config

    with pytest.raises(ConfigError, match="no such file or preset"):  # a bare name too long for a path: no crash
        resolve_config("x" * 300)
    printed = subprocess.run([sys.executable, "-c", RUN, "--config", text, "--print_config"], capture_output=True,
                             text=True, cwd=tmp_path)
    assert "num_images: 8" in printed.stdout and "seed: 3" in printed.stdout, printed.stderr[-2000:]


def test_every_shipped_config_passes_the_early_checks():
    known = load_options()["options"]
    for config in sorted((ROOT / "configs" / "prune").glob("*.yaml")):
        check_option_names(settings_in_effect(["--config", str(config)]), known, "python prune.py")


def test_settings_compose_like_the_parser():
    values = settings_in_effect(["--config", str(ROOT / "configs" / "prune" / "dino_vitb16.yaml"),
                                 "--data.root=/x", "--progress", "off", "--model.model_kwargs", "{depth: 2}"])
    assert values["data.init_args.root"] == "/x" and values["progress"] == "off"  # a word stays a string
    assert values["model.model_kwargs.depth"] == 2 and "model.model_kwargs.num_classes" not in values
    assert values["search.num_images"] == 1000


def test_values_of_the_wrong_kind_are_refused_before_torch(tmp_path):
    result, _ = _prune(["--search.max_evaluations=abc"], tmp_path)
    assert result.stdout.split() == ["2", "False"], result.stderr[-2000:]
    assert result.stderr.startswith("error: --search.max_evaluations: expected an integer, got 'abc'")
    kinds = load_options()["kinds"]
    from snapvit_pl.cli.preflight import check_option_values

    check_option_values({"search.sigma": "1e-3", "search.max_time": None, "search.sigma2": "x",  # as the parser reads
                         "export.split": "schedule", "correction.enabled": False}, kinds, "python prune.py")
    check_option_values({"export.split": "fitnes"}, kinds, "python prune.py")  # a word: the settings object checks it
