"""``python prune.py --help``: a first screen of the options people change (the values of the config in effect),
then every option, without importing torch; the shipped option list is the parser's."""
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from snapvit_pl.cli import prune_main
from snapvit_pl.config_files import merged_config
from snapvit_pl.cli.help import FIRST_SCREEN_KEYS, OPTIONS_FILE, render_options
from snapvit_pl.cli.prune import declared_option_hints, prune_parser

ROOT = Path(__file__).resolve().parents[2]


def _first_screen(text: str) -> list[str]:
    return text[:text.index("All options")].splitlines()


def test_the_first_screen_shows_the_options_people_change_one_line_each(capsys):
    assert prune_main(["--help", "--config", str(ROOT / "configs" / "prune" / "dino_vitb16.yaml"),
                       "--data.root", "/data/imagenet"]) == 0
    text = capsys.readouterr().out
    first = _first_screen(text)
    assert text.startswith("usage: python prune.py") and len(first) <= 60
    assert max(len(line) for line in text.splitlines()) <= 100
    shown = {line.split()[0][2:]: line.split()[1:] for line in first if line.startswith("  --")}
    for key in ("model.model_name", "data.init_args.root", "data.init_args.max_samples", "data.init_args.batch_size",
                "export.budgets", "out_dir", "trainer.devices", "correction.enabled", "evaluation.metrics",
                "evaluation.train_samples", "config", "resume"):
        assert key in shown, key
    # the values of the config in effect and the command line, not the demo's
    dino = merged_config(ROOT / "configs" / "prune" / "dino_vitb16.yaml")
    assert shown["model.model_name"][0] == dino["model"]["model_name"]
    assert shown["search.num_images"][0] == str(dino["search"]["num_images"])
    assert shown["data.init_args.root"][0] == "/data/imagenet"
    # then every option, the data's spelled as the README spells them
    rest = text[text.index("All options"):]
    for option in ("--search.max_evaluations", "--data.init_args.max_samples", "--importance.scorer.init_args.probes",
                   "--trainer.accelerator"):
        assert option in rest, option
    assert "--data.max_samples" not in text and rest.index("--search.") < rest.index("--trainer.")


def test_the_shipped_option_list_is_the_parsers():
    """prune_options.json is rendered from prune.py's parser: regenerate it (python -m snapvit_pl.cli.options) after
    changing an option, a default or its docstring."""
    shipped = json.loads(OPTIONS_FILE.read_text())
    assert shipped == json.loads(json.dumps(render_options(prune_parser(), declared_option_hints()))), "run python -m snapvit_pl.cli.options"
    assert set(FIRST_SCREEN_KEYS) - {"seg_data"} <= set(shipped["options"]) | set(shipped["defaults"])


def test_help_takes_well_under_three_seconds_and_imports_no_torch():
    code = ("import sys, time; t = time.perf_counter(); from snapvit_pl.cli import prune_main; "
            "status = prune_main(['--help']); print(status, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.stdout.split()[-2:] == ["0", "False"], result.stderr[-2000:]
    started = time.perf_counter()
    result = subprocess.run([sys.executable, str(ROOT / "prune.py"), "--help"], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    assert result.returncode == 0 and "All options" in result.stdout
    assert seconds < 3, f"python prune.py --help took {seconds:.1f} s"


def test_every_commands_description_is_whole_sentences():
    import importlib

    for name in ("extract", "evaluate", "deploy", "hub"):
        module = importlib.import_module(f"snapvit_pl.cli.{name}")
        description = module.build_parser().description
        first = " ".join(module.__doc__.split("\n\n")[0].replace("``", "").split())
        assert " ".join(description.split()).startswith(first) and first.endswith("."), name
        assert max(len(line) for line in description.splitlines()) <= 100


def test_train_and_extract_help_show_each_declared_range_and_choice():
    """The parsers read a declared range or choice as a plain type (the settings check it, once); the help still
    shows it, from the same declaration."""
    from snapvit_pl.cli import extract

    text = " ".join(extract.build_parser().format_help().split())
    assert "calibration images (plain views of a seeded subset of the pruning data); an integer > 0 (type: int" in text
    assert "; one of dense_fit, sparsegpt, bias (type: str" in text
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), "fit", "--help"], capture_output=True, text=True)
    text = " ".join(result.stdout.split())
    assert result.returncode == 0 and "peak AdamW learning rate (> 0); a number > 0 (type: float" in text, text[-2000:]
