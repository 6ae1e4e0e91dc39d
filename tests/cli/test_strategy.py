"""The strategy a pruning run picks for the devices and nodes asked for (the multi-process runs: test_ddp.py)."""
import pytest
import torch

from snapvit_pl.cli.prune import check_trainer_options
from snapvit_pl.errors import ConfigError
from snapvit_pl.lightning.strategy import PruningDDPStrategy, processes_per_node, pruning_strategy


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
    assert isinstance(pruning_strategy("auto", "auto", "auto", 1), PruningDDPStrategy)


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
        assert isinstance(chosen, PruningDDPStrategy) and chosen._start_method == expected
        assert pruning_strategy(chosen, "cpu", 1, 1) is chosen  # a recorded config naming it resumes


@pytest.mark.parametrize("strategy, devices", [("fsdp", 2), ("deepspeed", 1), ("single_device", 2),
                                               ({"class_path": "my.Strategy"}, 2)])
def test_a_strategy_the_pruning_run_cannot_use_is_refused(strategy, devices):
    with pytest.raises(ConfigError, match="leave the strategy unset"):
        pruning_strategy(strategy, "cpu", devices, 1)


DEFAULTS = {"max_epochs": 1, "limit_train_batches": None, "fast_dev_run": False, "devices": 1, "num_nodes": 1,
            "accumulate_grad_batches": 1, "max_time": None}


@pytest.mark.parametrize("key, value, hint", [("limit_train_batches", 0.5, "max_samples"), ("fast_dev_run", True, "quick"),
                                              ("max_time", "00:00:01:00", "search.max_time"), ("max_epochs", 0, "one epoch over the data"),
                                              ("accumulate_grad_batches", 4, "nothing accumulates")])
def test_trainer_options_the_pipeline_does_not_honour_are_refused(key, value, hint):
    check_trainer_options(dict(DEFAULTS), DEFAULTS)  # the defaults, as a recorded config holds them, pass
    with pytest.raises(ConfigError, match=f"--trainer.{key}.*{hint}"):
        check_trainer_options({**DEFAULTS, key: value}, DEFAULTS)


@pytest.mark.parametrize("devices", [-2, 0, "-3"])
def test_device_counts_that_cannot_launch_are_refused(devices):
    with pytest.raises(ConfigError, match="--trainer.devices"):
        check_trainer_options({**DEFAULTS, "devices": devices}, DEFAULTS)


def test_several_nodes_need_a_cluster_launcher(monkeypatch):
    for key in ("WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "LSB_JOBID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match="no cluster launcher"):
        check_trainer_options({**DEFAULTS, "num_nodes": 2}, DEFAULTS)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    check_trainer_options({**DEFAULTS, "num_nodes": 2}, DEFAULTS)
