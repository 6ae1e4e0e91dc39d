"""Each setting parsed and checked once (issue 47): in one ``prune.py`` run with three budgets, each budget is parsed
once (at the command line's edge), each budget's sub-network is resolved once by the export, the budgets' reachability
is checked once, and the scorer's ``probes`` is range-checked once after the parser."""
from collections import Counter

import pytest

from snapvit_pl.cli import prune_main

BUDGETS = "[{sparsity: 0.3}, {flops: 0.6}, {mlp_ratio: 0.35, head_ratio: 0.25}]"


@pytest.fixture
def counted(monkeypatch):
    """Counts of the calls that parse, resolve and check, by what they were given."""
    from snapvit_pl import ranges
    from snapvit_pl.elastic import budget as budget_module, scores as scores_module
    from snapvit_pl.pipeline import driver

    calls: Counter = Counter()
    made, subnet, check, checked = (budget_module.Budget.__post_init__, scores_module.ElasticScores.subnet,
                                    driver.check_budgets, ranges._check)

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

    def counting_range(name, value, hint):
        if name.endswith(".probes"):
            calls["probes checked"] += 1
        return checked(name, value, hint)

    monkeypatch.setattr(budget_module.Budget, "__post_init__", counting_post_init)
    monkeypatch.setattr(scores_module.ElasticScores, "subnet", counting_subnet)
    monkeypatch.setattr(driver, "check_budgets", counting_check)
    monkeypatch.setattr(ranges, "_check", counting_range)
    return calls


def _called_from(*functions: str) -> bool:
    import inspect

    return any(frame.function in functions for frame in inspect.stack())


def _in_export() -> bool:
    """Whether the caller is the export stage (the split choice resolves candidates, not the budgets' models)."""
    return _called_from("_export", "extract_models")


def test_one_prune_run_parses_resolves_and_checks_each_setting_once(tiny_prune_args, counted):
    args = [a for a in tiny_prune_args if not a.startswith("--export.budgets")] + [
        f"--export.budgets={BUDGETS}", "--importance.scorer.init_args.probes=2", "--evaluation.metrics=[]"]
    assert prune_main(args) == 0
    labels = ["sparsity0.3", "flops0.6", "mlp0.35_head0.25"]
    assert {label: counted[f"parse {label}"] for label in labels} == dict.fromkeys(labels, 1), counted
    assert {label: counted[f"resolve {label}"] for label in labels} == dict.fromkeys(labels, 1), counted
    assert counted["check_budgets"] == 1 and counted["probes checked"] == 1, counted
