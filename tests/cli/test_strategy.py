"""The strategy a pruning run picks for the devices and nodes asked for (the multi-process runs: test_ddp.py)."""
import pytest
import torch

from snapvit_pl.cli.prune import processes_per_node, pruning_strategy
from snapvit_pl.errors import ConfigError

DDP = "snapvit_pl.lightning.strategy.PruningDDPStrategy"


@pytest.fixture
def four_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)


def test_processes_per_node():
    assert processes_per_node("cpu", 1) == 1 and processes_per_node("cpu", 2) == processes_per_node("cpu", "2") == 2
    assert processes_per_node("gpu", [0, 1, 3]) == 3 and processes_per_node("gpu", "0,1") == 2
    assert processes_per_node("cpu", "auto") == 1


def test_auto_on_a_machine_with_four_gpus(four_gpus):
    assert processes_per_node("auto", "auto") == processes_per_node("gpu", -1) == 4
    assert pruning_strategy("auto", "auto", "auto", 1)["class_path"] == DDP


@pytest.mark.parametrize("strategy, devices, nodes, expected", [
    ("auto", 1, 1, "auto"),
    ("single_device", 1, 1, "single_device"),
    ("auto", 2, 1, "popen"),
    ("auto", 1, 2, "popen"),
    ("ddp", 2, 1, "popen"),
    ("ddp_spawn", 2, 1, "spawn"),
    ("ddp_fork", 1, 1, "fork"),
])
def test_several_devices_or_nodes_choose_the_pruning_ddp(strategy, devices, nodes, expected):
    chosen = pruning_strategy(strategy, "cpu", devices, nodes)
    if expected in ("auto", "single_device"):
        assert chosen == expected
    else:
        assert chosen == {"class_path": DDP, "init_args": {"start_method": expected}}


@pytest.mark.parametrize("strategy, devices", [("fsdp", 2), ("deepspeed", 1), ("single_device", 2),
                                               ({"class_path": "my.Strategy"}, 2)])
def test_a_strategy_the_pruning_run_cannot_use_is_refused(strategy, devices):
    with pytest.raises(ConfigError, match="leave the strategy unset"):
        pruning_strategy(strategy, "cpu", devices, 1)
