"""DDP for the pruning run: one process per device, no gradient-synchronising wrapper."""
from __future__ import annotations

from pytorch_lightning.strategies import DDPStrategy


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
