"""How a run's processes are told apart (``snapvit_pl/run/launch.py``)."""
import pytest

from snapvit_pl.errors import ConfigError
from snapvit_pl.run.launch import CLUSTER_ENVIRONMENT, RANK_VARIABLES, check_launch, first_process, shared_run_dir


@pytest.mark.parametrize("variable", RANK_VARIABLES)
def test_a_process_is_the_first_unless_a_launcher_gave_it_another_rank(monkeypatch, variable):
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert first_process()
    monkeypatch.setenv(variable, "0")
    assert first_process()
    monkeypatch.setenv(variable, "3")
    assert not first_process()


def test_several_nodes_need_a_cluster_launcher_and_a_shared_folder(monkeypatch):
    for name in CLUSTER_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="--trainer.num_nodes 2: no cluster launcher started this process"):
        check_launch({"devices": 1, "num_nodes": 2})
    with pytest.raises(ConfigError, match="--trainer.devices 0: give a positive count"):
        check_launch({"devices": 0})
    monkeypatch.setenv("SLURM_NTASKS", "2")
    check_launch({"devices": 1, "num_nodes": 2})
    with pytest.raises(ConfigError, match="needs --out_dir"):
        shared_run_dir(2)
