"""Each setting parsed and checked once (issues 47 and 52): in one ``prune.py`` run with three budgets, each budget is
parsed once (at the command line's edge), each budget's sub-network is resolved once by the export, the budgets'
reachability is checked once, every number with a declared range is range-checked once, the progress mode is
checked once, the run folder is checked once before the run takes it (and once more under its lock, where another
run may have finished since), and each config file is read once, counting every layer a value passes (the checks
before torch is imported, the parser, the settings objects, the pipeline)."""
from collections import Counter

import pytest

from snapvit_pl.cli import prune_main

BUDGETS = "[{sparsity: 0.3}, {flops: 0.6}, {mlp_ratio: 0.35, head_ratio: 0.25}]"
#: Settings with a declared range or choices, given non-default values (each must be checked exactly once).
RANGED = {"--importance.scorer.init_args.probes": "2", "--search.sigma": "0.37", "--export.split_step": "0.2",
          "--correction.num_samples": "8", "--evaluation.knn_k": "5", "--data.init_args.batch_size": "16",
          "--model.seed": "3", "--importance.min_head_keep": "0.25",
          "--importance.scorer.init_args.gram": "block", "--importance.scorer.init_args.precision": "32",
          "--importance.allocation": "uniform", "--search.parametrization": "linear", "--export.split": "schedule",
          "--correction.refit": "following", "--correction.damping": "max"}


@pytest.fixture
def counted(monkeypatch):
    """Counts of the calls that parse, resolve and check, by what they were given."""
    from snapvit_pl import progress, ranges
    from snapvit_pl import config_files as common
    from snapvit_pl.cli import prune as prune_cli
    from snapvit_pl.elastic import budget as budget_module, scores as scores_module
    from snapvit_pl.pipeline import export_stage
    from snapvit_pl.run import folder as run_folder

    calls: Counter = Counter()
    made, subnet, check, checked = (budget_module.Budget.__post_init__, scores_module.ElasticScores.subnet,
                                    export_stage.check_budgets, ranges.check_value)
    admits = {kind: kind.admits for kind in (ranges.Range, ranges.Choices)}

    def counting_post_init(self):  # a Budget made by Budget.parse from text or a mapping (not the split grid's)
        made(self)
        if _called_from("parse"):
            calls[f"parse {self.label()}"] += 1

    def counting_subnet(self, budget=None, *args, **kwargs):
        if self.splits is not None and getattr(budget, "label", None) and _in_export():
            calls[f"resolve {budget.label()}"] += 1
        return subnet(self, budget, *args, **kwargs)

    def counting_check(*args, **kwargs):
        calls["check_budgets"] += 1
        return check(*args, **kwargs)

    def counting_range(name, value, hint):  # the one range check
        calls[f"range {name}"] += 1
        return checked(name, value, hint)

    def counting_admits(self, value):  # the one comparison against a range: who else calls it is another layer
        if not _called_from("check_value"):
            calls["range compared outside check_value"] += 1
        return admits[type(self)](self, value)

    resolve_mode, check_folder, read_file = progress.resolve_mode, run_folder.check_run_folder, common._read_config_file

    def counting_mode(mode, *args, **kwargs):  # the one check of the progress mode
        calls[f"progress {mode}"] += 1
        return resolve_mode(mode, *args, **kwargs)

    def counting_folder(path, *args, locked=False, **kwargs):
        calls["run folder checked under its lock" if locked else "run folder checked"] += 1
        return check_folder(path, *args, locked=locked, **kwargs)

    def counting_read(path):  # a config file read from disk (and parsed, and checked)
        calls[f"read {path.name}"] += 1
        return read_file(path)

    common._READ.clear()  # (files an earlier test read in this process)
    monkeypatch.setattr(progress, "resolve_mode", counting_mode)
    monkeypatch.setattr(prune_cli, "resolve_mode", counting_mode)
    monkeypatch.setattr(prune_cli, "check_run_folder", counting_folder)
    monkeypatch.setattr(run_folder, "check_run_folder", counting_folder)
    monkeypatch.setattr(common, "_read_config_file", counting_read)
    monkeypatch.setattr(budget_module.Budget, "__post_init__", counting_post_init)
    monkeypatch.setattr(scores_module.ElasticScores, "subnet", counting_subnet)
    monkeypatch.setattr(export_stage, "check_budgets", counting_check)
    monkeypatch.setattr(ranges, "check_value", counting_range)
    monkeypatch.setattr(ranges.Range, "admits", counting_admits)
    monkeypatch.setattr(ranges.Choices, "admits", counting_admits)
    return calls


def _called_from(*functions: str) -> bool:
    import inspect

    return any(frame.function in functions for frame in inspect.stack())


def _in_export() -> bool:
    """Whether the caller is the export stage (the split choice resolves candidates, not the budgets' models)."""
    return _called_from("_export", "extract_models")


def test_one_prune_run_parses_resolves_and_checks_each_setting_once(tiny_prune_args, counted, tmp_path):
    args = [a for a in tiny_prune_args if not a.startswith(("--export.budgets", "--data.init_args.batch_size",
                                                            "--evaluation.knn_k"))]
    from snapvit_pl.config_files import DEFAULT_PRUNE_CONFIG

    config = tmp_path / "extra.yaml"  # a config file of the user's, extending one of its own
    (tmp_path / "base.yaml").write_text("search:\n  num_images: 16\n")
    config.write_text("base: base.yaml\nreport:\n  plots: false\n")
    args = ["--config", str(DEFAULT_PRUNE_CONFIG), "--config", str(config), *args, f"--export.budgets={BUDGETS}",
            "--evaluation.metrics=[]", *(f"{k}={v}" for k, v in RANGED.items()), "--progress=lines"]
    assert prune_main(args) == 0
    labels = ["sparsity0.3", "flops0.6", "mlp0.35_head0.25"]
    assert {label: counted[f"parse {label}"] for label in labels} == dict.fromkeys(labels, 1), counted
    assert {label: counted[f"resolve {label}"] for label in labels} == dict.fromkeys(labels, 1), counted
    assert counted["check_budgets"] == 1, counted
    given = {f"range {key[2:]}" for key in RANGED}
    assert {name: counted[name] for name in given} == dict.fromkeys(given, 1), counted
    twice = {name: n for name, n in counted.items() if name.startswith("range ") and n > 1}
    assert not twice and not counted["range compared outside check_value"], twice
    assert counted["progress lines"] == 1 and not [k for k in counted if k.startswith("progress ")
                                                   and k != "progress lines"], counted
    assert counted["run folder checked"] == 1 and counted["run folder checked under its lock"] == 1, counted
    reads = {name: n for name, n in counted.items() if name.startswith("read ")}
    assert reads == {f"read {DEFAULT_PRUNE_CONFIG.name}": 1, "read extra.yaml": 1, "read base.yaml": 1}, reads


def test_no_parser_layer_checks_a_range():
    """The command lines' parsers and the checks before torch is imported hold no range of their own: every option's
    parsed type is a plain number (jsonargparse's constrained types would check each value again, twice: as it parses
    and as it instantiates), and prune_options.json (what the early checks read) records none."""
    from jsonargparse.typing import registered_types

    from snapvit_pl.cli import deploy, evaluate, extract
    from snapvit_pl.cli.help import load_options
    from snapvit_pl.cli.prune import prune_parser

    restricted = {kind for kind in registered_types.values() if hasattr(kind, "_restrictions")}
    for parser in (prune_parser(), extract.build_parser(), evaluate.build_parser(), deploy.build_parser()):
        hints = [str(getattr(action, "_typehint", "")) for action in parser._actions]
        assert not [h for h in hints if any(kind.__name__ in h for kind in restricted)], hints
    assert "ranges" not in load_options()


@pytest.mark.parametrize("option, message", [
    ("--search.sigma=0", "error: search.sigma must be a number > 0, got 0.0"),
    ("--progress=loud", "error: --progress must be one of auto, bar, lines, off, got 'loud'"),
    ("--out_dir={file}", "error: --out_dir {file} is a file, not a directory; choose a directory path"),
])
def test_a_bad_setting_is_refused_before_the_model_is_built(tiny_prune_args, monkeypatch, capsys, tmp_path, option,
                                                            message):
    """The one check of a range (the settings objects), of the progress mode and of the run folder (after the parse)
    comes before the model is built: a bad value costs no weights loaded (nor downloaded), and is one line."""
    from snapvit_pl.lightning import pruning_module

    file = tmp_path / "a_file"
    file.write_text("")
    built = []
    monkeypatch.setattr(pruning_module, "load_backbone", lambda *a, **k: built.append(a) or pytest.fail("built"))
    assert prune_main([*tiny_prune_args, option.format(file=file)]) == 2  # (the last --out_dir wins)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [message.format(file=file)] and not built
