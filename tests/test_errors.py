import argparse

import pytest

from snapvit_pl.errors import ConfigError, config_error, exit_with_error

NESTED = '''Parser key "data":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'snapvit_pl.data.base.VisionDataModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'snapvit_pl.data.ClassificationDataModule':
        Parser key "batch_size":
          Expected a <class 'int'>. Got value: abc
    - Expected a <class 'NoneType'>
  Given value type: <class 'jsonargparse._util.NestedArg'>'''


@pytest.mark.parametrize("message, expected", [
    (NESTED, "--data.init_args.batch_size: expected an integer, got 'abc'"),
    ('Parser key "search.max_evaluations":\n  Expected a <class \'int\'>. Got value: abc',
     "--search.max_evaluations: expected an integer, got 'abc'"),
    ('Parser key "correction.reconstruct_steps":\n  Does not validate against any of the Union subtypes\n  Errors:\n'
     '    - Expected a <class \'int\'>\n    - Expected a typing.Literal[\'auto\']\n  Given value: many',
     "--correction.reconstruct_steps: expected an integer or auto, got 'many'"),
])
def test_parser_errors_become_one_line_naming_the_key(message, expected):
    error = config_error(argparse.ArgumentError(None, message), "python prune.py")
    assert isinstance(error, ConfigError) and "\n" not in str(error)
    assert str(error) == f"{expected}; see python prune.py --help for the accepted values"


def test_a_misspelt_option_gets_the_likely_one_at_any_depth():
    """A top-level option of the command's parser, and an argument of a class given by class_path (the data's, the
    scorer's): "did you mean", as the command line's own check says it."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--search.max_evaluations", type=int)
    error = config_error(argparse.ArgumentError(None, "unrecognized arguments: --search.max_evaluationz=3"),
                         "python prune.py", parser)
    assert str(error) == ("--search.max_evaluationz: no such option; did you mean --search.max_evaluations? see python "
                          "prune.py --help for the options")
    nested = NESTED.replace("Parser key \"batch_size\":\n          Expected a <class 'int'>. Got value: abc",
                            "Option 'rot' is not accepted")
    assert str(config_error(argparse.ArgumentError(None, nested), "snapvit-pl evaluate")) == (
        "--data.init_args.rot: no such option; did you mean --data.init_args.root? see snapvit-pl evaluate --help for "
        "the options")


def test_exit_with_error_prints_one_line_or_raises_when_verbose(capsys, monkeypatch):
    monkeypatch.delenv("SNAPVIT_VERBOSE", raising=False)
    assert exit_with_error(ConfigError("bad\n  value"), verbose=False) == 2
    assert capsys.readouterr().err == "error: bad value\n"  # white space folded: one line
    with pytest.raises(ConfigError):
        exit_with_error(ConfigError("bad"), verbose=True)
    monkeypatch.setenv("SNAPVIT_VERBOSE", "1")
    with pytest.raises(ConfigError):
        exit_with_error(ConfigError("bad"))


def test_the_os_error_behind_any_library_error():
    import errno

    from safetensors import SafetensorError

    from snapvit_pl.errors import StorageError, os_error

    assert os_error(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")).errno \
        == errno.ENOSPC
    wrapped = RuntimeError("failed")
    wrapped.__cause__ = OSError(errno.EFBIG, "File too large")
    assert os_error(wrapped).errno == errno.EFBIG
    assert os_error(RuntimeError("unexpected pos 704 vs 598")) is None and os_error(StorageError("x")) is None


def test_a_storage_error_without_a_file_names_the_folder_written_never_the_working_directory(tmp_path, monkeypatch):
    import errno

    from snapvit_pl.errors import storage_error

    monkeypatch.chdir(tmp_path)
    full = OSError(errno.ENOSPC, "No space left on device")  # (a writer that does not say which file)
    assert str(storage_error(full, where="/tmp")).startswith("cannot write a file in /tmp: No space left on device")
    assert "free in /tmp" in str(storage_error(full, where="/tmp"))
    assert "free space unknown" in str(storage_error(full)) and str(tmp_path) not in str(storage_error(full))


@pytest.mark.parametrize("value, verbose", [("", False), ("0", False), ("false", False), ("1", True), ("yes", True)])
def test_snapvit_verbose_is_read_as_on_or_off(monkeypatch, value, verbose):
    from snapvit_pl.errors import env_verbose

    monkeypatch.setenv("SNAPVIT_VERBOSE", value)
    assert env_verbose() is verbose
    monkeypatch.setenv("SNAPVIT_VERBOSE", "maybe")
    with pytest.raises(ConfigError, match="SNAPVIT_VERBOSE='maybe'"):
        env_verbose()


def test_an_io_error_that_names_no_file_is_reported_in_the_folder_the_command_writes(tmp_path, capsys):
    """A library's write failing without a file name (a log, a checkpoint) was reported with the free space of the
    working directory, naming no file: now the folder the command said it writes, and that folder's space."""
    import errno

    from snapvit_pl.cli.common import run_command, writing_to

    def body(argv):
        writing_to(tmp_path / "out")
        raise OSError(errno.ENOSPC, "No space left on device")

    assert run_command(body, [], "snapvit-pl extract") == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: cannot write a file in {tmp_path / 'out'}: No space left") and \
        f"free in {tmp_path}" in line, line


def test_issue_52_settings_bounded_by_the_model_and_labels_that_never_round_a_change_away(tmp_path):
    """A budget label never rounds a change away (flops 0.9999999 is not the dense model's flops1); a relative
    weights file is recorded as the file it names; a dangling symbolic link as the output folder is named as such;
    more greedy stages than removable units are refused naming the count."""
    import os

    from snapvit_pl.io import check_output_dir
    from snapvit_pl.elastic import Budget
    from snapvit_pl.errors import ConfigError
    from snapvit_pl.models import BackboneSpec

    assert Budget(flops=0.9999999).label() == "flops0.9999999" and Budget(flops=0.5).label() == "flops0.5"
    assert Budget(sparsity=0.3).label() == "sparsity0.3" and Budget(flops=1.0).label() == "flops1"
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        spec = BackboneSpec("vit_tiny_patch16_224", False, "weights/model.safetensors")
        shipped = BackboneSpec("vit_tiny_patch16_224", False, "assets/reference_vit_fmnist/model.safetensors")
    finally:
        os.chdir(here)
    assert spec.checkpoint_path == str(tmp_path / "weights" / "model.safetensors")
    from snapvit_pl.io import DATA_ROOT  # a preset's path, missing here: the shipped file, wherever the command runs

    assert shipped.checkpoint_path == str((DATA_ROOT / "assets/reference_vit_fmnist/model.safetensors").absolute())
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match="symbolic link to .*gone, which does not exist"):
        check_output_dir(tmp_path / "link", "--out_dir")

    from families import FAMILIES

    from snapvit_pl.models import load_backbone
    from snapvit_pl.scoring import GaussNewtonGreedy

    model = load_backbone(FAMILIES["dino_vit"])
    with pytest.raises(ConfigError, match=r"stages=1000000\): this model has \d+ units .* lower stages"):
        GaussNewtonGreedy(stages=1000000).bind(model)
    with pytest.raises(ConfigError, match=r"rank=100000\): this model has \d+ units.*lower rank"):
        GaussNewtonGreedy(gram="lowrank", rank=100000).bind(model)
