"""How a run's processes are started and told apart: the device and node counts that can launch, the first
process, what a cluster launcher sets, and the run folder the first process chooses for the others. Torch-free:
the commands check these before anything heavy is imported."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def check_device_counts(trainer: Any) -> None:
    """Refuse a ``--trainer.devices`` or ``--trainer.num_nodes`` that cannot launch anything (0, -2, ...), before
    Lightning does it with a traceback (``prune``, ``train``, ``pretrain``).

    Raises:
        ConfigError: one line naming the option.
    """
    devices = trainer.get("devices")
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, int) and not isinstance(devices, bool) and (devices == 0 or devices < -1):
        raise ConfigError(f"--trainer.devices {devices}: give a positive count, -1 or auto (every device), or a list "
                          "of device indices")
    nodes = trainer.get("num_nodes")
    nodes = 1 if nodes is None else nodes
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise ConfigError(f"--trainer.num_nodes {nodes!r}: give a positive number of nodes")


#: What the launchers set to a process's rank (Lightning's own processes: LOCAL_RANK; torchrun: RANK; SLURM, MPI).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def first_process() -> bool:
    """Whether this is the first (or only) process of a run: every other process of a multi-process run (started by
    Lightning for its other devices, or by torchrun / srun / mpirun) has a non-zero rank in its environment."""
    return all(os.environ.get(name, "0").strip() in ("", "0") for name in RANK_VARIABLES)


#: What a cluster launcher (torchrun, SLURM, LSF, MPI) sets in every process it starts.
CLUSTER_ENVIRONMENT = ("WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "LSB_JOBID", "OMPI_COMM_WORLD_SIZE",
                       "PMI_SIZE")
#: The environment variable through which the first process hands the run directory it chose to the processes
#: Lightning starts for the other devices (they run this command line again).
RUN_DIR_ENV = "SNAPVIT_RUN_DIR"


def shared_run_dir(num_nodes: int) -> Path:
    """The default run directory, ``runs/prune/<timestamp>``: chosen once, by the first process, and handed to the
    processes it starts; processes started by a cluster launcher cannot agree on one and must be given it.

    Raises:
        ConfigError: a multi-process launch from outside without ``--out_dir``.
    """
    if os.environ.get("LOCAL_RANK", "0") != "0" and RUN_DIR_ENV in os.environ:  # started by the first process
        return Path(os.environ[RUN_DIR_ENV])
    if (num_nodes or 1) > 1 or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise ConfigError("a run of several processes started by a launcher (torchrun, srun, several nodes) needs "
                          "--out_dir: a directory every process sees, so that they write one run")
    out_dir = Path("runs") / "prune" / time.strftime("%Y%m%d-%H%M%S")
    os.environ[RUN_DIR_ENV] = str(out_dir)  # read back by the processes Lightning starts for the other devices
    return out_dir


def check_launch(trainer: Any) -> None:
    """:func:`check_device_counts`, and a run of several nodes that no cluster launcher started (``prune``).

    Raises:
        ConfigError: one line naming the option.
    """
    check_device_counts(trainer)
    nodes = trainer.get("num_nodes") or 1
    if nodes > 1 and not any(key in os.environ for key in CLUSTER_ENVIRONMENT):
        raise ConfigError(f"--trainer.num_nodes {nodes}: no cluster launcher started this process (torchrun, srun, "
                          "mpirun); start one process per node with it, or run on one node without --trainer.num_nodes")
