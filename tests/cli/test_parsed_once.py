"""Each setting parsed and checked once (issues 47 and 52): in one ``prune.py`` run with three budgets, each budget is
parsed once (at the command line's edge), each budget's sub-network is resolved once by the export, the budgets'
reachability is checked once, and every number with a declared range is range-checked once, counting every layer a
value passes (the checks before torch is imported, the parser, the settings objects, the pipeline)."""
from collections import Counter

import pytest

from snapvit_pl.cli import prune_main

BUDGETS = "[{sparsity: 0.3}, {flops: 0.6}, {mlp_ratio: 0.35, head_ratio: 0.25}]"
#: Ranged settings given non-default values (each must be range-checked exactly once).
RANGED = {"--importance.scorer.init_args.probes": "2", "--search.sigma": "0.37", "--export.split_step": "0.2",
          "--correction.num_samples": "8", "--evaluation.knn_k": "5", "--data.init_args.batch_size": "16",
          "--model.seed": "3", "--importance.min_head_keep": "0.25"}


@pytest.fixture
def counted(monkeypatch):
    """Counts of the calls that parse, resolve and check, by what they were given."""
    from snapvit_pl import ranges
    from snapvit_pl.elastic import budget as budget_module, scores as scores_module
    from snapvit_pl.pipeline import driver

    calls: Counter = Counter()
    made, subnet, check, checked, admits = (budget_module.Budget.__post_init__, scores_module.ElasticScores.subnet,
                                            driver.check_budgets, ranges.check_value, ranges.Range.admits)

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
        return admits(self, value)

    monkeypatch.setattr(budget_module.Budget, "__post_init__", counting_post_init)
    monkeypatch.setattr(scores_module.ElasticScores, "subnet", counting_subnet)
    monkeypatch.setattr(driver, "check_budgets", counting_check)
    monkeypatch.setattr(ranges, "check_value", counting_range)
    monkeypatch.setattr(ranges.Range, "admits", counting_admits)
    return calls


def _called_from(*functions: str) -> bool:
    import inspect

    return any(frame.function in functions for frame in inspect.stack())


def _in_export() -> bool:
    """Whether the caller is the export stage (the split choice resolves candidates, not the budgets' models)."""
    return _called_from("_export", "extract_models")


def test_one_prune_run_parses_resolves_and_checks_each_setting_once(tiny_prune_args, counted):
    args = [a for a in tiny_prune_args if not a.startswith(("--export.budgets", "--data.init_args.batch_size",
                                                            "--evaluation.knn_k"))]
    args += [f"--export.budgets={BUDGETS}", "--evaluation.metrics=[]", *(f"{k}={v}" for k, v in RANGED.items())]
    assert prune_main(args) == 0
    labels = ["sparsity0.3", "flops0.6", "mlp0.35_head0.25"]
    assert {label: counted[f"parse {label}"] for label in labels} == dict.fromkeys(labels, 1), counted
    assert {label: counted[f"resolve {label}"] for label in labels} == dict.fromkeys(labels, 1), counted
    assert counted["check_budgets"] == 1, counted
    given = {f"range {key[2:]}" for key in RANGED}
    assert {name: counted[name] for name in given} == dict.fromkeys(given, 1), counted
    twice = {name: n for name, n in counted.items() if name.startswith("range ") and n > 1}
    assert not twice and not counted["range compared outside check_value"], twice


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


def test_a_range_is_refused_before_the_model_is_built(tiny_prune_args, monkeypatch, capsys):
    """The one range check sits in the settings objects, which the command line builds before the model: a value out
    of range costs no weights loaded (nor downloaded), and is one line naming the YAML key."""
    from snapvit_pl.lightning import pruning_module

    built = []
    monkeypatch.setattr(pruning_module, "load_backbone", lambda *a, **k: built.append(a) or pytest.fail("built"))
    assert prune_main([*tiny_prune_args, "--search.sigma=0"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == ["error: search.sigma must be a number > 0, got 0.0"] and not built
