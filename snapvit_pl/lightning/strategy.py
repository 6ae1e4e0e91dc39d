"""DDP for the pruning run (one process per device, no gradient-synchronising wrapper), and the strategy a run
picks for the devices and nodes asked for."""
from __future__ import annotations

from typing import Any

import torch
from pytorch_lightning.strategies import DDPStrategy

from ..errors import ConfigError


class PruningDDPStrategy(DDPStrategy):
    """Lightning's DDP (process group, distributed sampler, rank-zero logic) without wrapping the
    module in ``DistributedDataParallel``.

    The pruning run trains nothing: scorers take gradients with ``torch.autograd.grad`` and
    all-reduce their own statistics, and the search evaluates each generation's candidates across ranks.
    A DDP wrapper would only add gradient hooks that never fire. ``prune.py`` uses this class
    whenever ``--trainer.strategy ddp`` is given.
    """

    strategy_name = "ddp_pruning"

    def configure_ddp(self) -> None:
        """Keep ``self.model`` as the bare LightningModule."""


def close_process_group() -> None:
    """End a finished multi-process run together: every rank waits for the others, then the process group is
    destroyed before the interpreter exits. Without it a rank that finishes first can exit while gloo's threads
    still run, which aborts it ("terminate called without an active exception") and makes Lightning kill the
    whole run. Does nothing in a single process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


#: Strategies a pruning run maps to its own DDP (no gradient wrapper): name -> the process start method.
DDP_STRATEGIES = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork", "ddp_notebook": "fork"}


def processes_per_node(accelerator: Any, devices: Any) -> int:
    """How many processes Lightning starts per node for ``--trainer.accelerator`` / ``--trainer.devices``."""
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text:
            return len([d for d in text.split(",") if d.strip()])
        devices = int(text) if text.lstrip("-").isdigit() else text
    if devices in ("auto", -1):
        gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
        return max(1, torch.cuda.device_count()) if gpu else 1
    return int(devices)


def pruning_strategy(strategy: Any, accelerator: Any, devices: Any, num_nodes: int) -> Any:
    """The strategy a pruning run uses for what the user asked: several devices or nodes (``--trainer.devices N``,
    ``auto`` on a multi-GPU machine, ``--trainer.num_nodes M``) or a DDP strategy by name -> the pruning DDP
    (:class:`~snapvit_pl.lightning.strategy.PruningDDPStrategy`); one device -> as given.

    Raises:
        ConfigError: a strategy the pruning run cannot use.
    """
    if isinstance(strategy, PruningDDPStrategy):  # (a config that names it: runs written before 0.1.1)
        return strategy
    several = processes_per_node(accelerator, devices) > 1 or (num_nodes or 1) > 1
    name = strategy if isinstance(strategy, str) else None
    if name in DDP_STRATEGIES or (name == "auto" and several):
        return PruningDDPStrategy(start_method=DDP_STRATEGIES.get(name, "popen"))
    if name in ("auto", "single_device") and not several:
        return strategy
    shown = name or type(strategy).__name__
    raise ConfigError(f"--trainer.strategy {shown}: a pruning run trains nothing and shares its work across processes "
                      f"with its own DDP; leave the strategy unset (several devices or nodes choose it) or give one of "
                      f"{', '.join(DDP_STRATEGIES)}")
