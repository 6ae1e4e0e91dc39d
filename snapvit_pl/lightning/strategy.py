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
