import argparse

import pytest

from snapvit_pl.errors import ConfigError, config_error, exit_with_error

NESTED = '''Parser key "data":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'snapvit_pl.data.base.VisionDataModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'snapvit_pl.data.ClassificationDataModule':
        Parser key "batch_size":
          Not of type PositiveInt: 0 does not conform to restriction v>0
    - Expected a <class 'NoneType'>
  Given value type: <class 'jsonargparse._util.NestedArg'>'''


@pytest.mark.parametrize("message, expected", [
    (NESTED, "--data.init_args.batch_size: 0 is out of range: must be > 0"),
    ('Parser key "search.max_evaluations":\n  Expected a <class \'int\'>. Got value: abc',
     "--search.max_evaluations: Expected a <class 'int'>. Got value: abc"),
    ("unrecognized arguments: --search.max_evaluationz=3", "unrecognized arguments: --search.max_evaluationz=3"),
])
def test_parser_errors_become_one_line_naming_the_key(message, expected):
    error = config_error(argparse.ArgumentError(None, message), "python prune.py")
    assert isinstance(error, ConfigError) and "\n" not in str(error)
    assert str(error) == f"{expected}; see python prune.py --help for the accepted values"


def test_exit_with_error_prints_one_line_or_raises_when_verbose(capsys, monkeypatch):
    monkeypatch.delenv("SNAPVIT_VERBOSE", raising=False)
    assert exit_with_error(ConfigError("bad\n  value"), verbose=False) == 2
    assert capsys.readouterr().err == "error: bad value\n"  # white space folded: one line
    with pytest.raises(ConfigError):
        exit_with_error(ConfigError("bad"), verbose=True)
    monkeypatch.setenv("SNAPVIT_VERBOSE", "1")
    with pytest.raises(ConfigError):
        exit_with_error(ConfigError("bad"))
