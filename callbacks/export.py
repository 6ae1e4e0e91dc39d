"""Export: the elastic-scores artifact and the pruned checkpoints asked for."""
from __future__ import annotations

import copy
import time
from typing import Optional

import pytorch_lightning as pl
import torch

from snapvit_pl.elastic import Budget, CostModel, ElasticScores
from snapvit_pl.errors import SnapViTError
from snapvit_pl.lightning.pruning_module import ExtractedModel, PruningModule
from snapvit_pl.models import prunable_blocks, prune_, save_pruned

#: The paper's evaluated (mlp_ratio, head_ratio) pairs: ~10-60% of the backbone's parameters.
PAPER_BUDGETS = [
    {"mlp_ratio": 0.15, "head_ratio": 0.0}, {"mlp_ratio": 0.25, "head_ratio": 0.1},
    {"mlp_ratio": 0.35, "head_ratio": 0.2}, {"mlp_ratio": 0.45, "head_ratio": 0.3},
    {"mlp_ratio": 0.55, "head_ratio": 0.4}, {"mlp_ratio": 0.65, "head_ratio": 0.5},
]


class ExportCallback(pl.Callback):
    """Saves ``elastic_scores.safetensors`` and extracts, post-processes and saves one model per budget.

    Each extracted model goes through the hooks other callbacks registered on the module
    (weight correction, then evaluation) before it is written to ``models/<label>/``.

    Args:
        budgets: budgets as dicts of :class:`snapvit_pl.elastic.Budget` fields, e.g.
            ``{"mlp_ratio": 0.35, "head_ratio": 0.2}``, ``{"sparsity": 0.4}``, ``{"flops": 0.5}``,
            ``{"params": 20e6}``; default: the paper's six pairs.
        mlp_multiple: round MLP widths to this multiple (8 or 16 suit most hardware).
        save_models: write the pruned checkpoints (else only the scores and the report).
        scores_file: file name of the elastic artifact in the run directory.
    """

    def __init__(
        self,
        budgets: Optional[list[dict[str, float]]] = None,
        mlp_multiple: int = 1,
        save_models: bool = True,
        scores_file: str = "elastic_scores.safetensors",
    ):
        self.budgets = [Budget(**b) for b in (budgets if budgets is not None else PAPER_BUDGETS)]
        self.mlp_multiple, self.save_models, self.scores_file = mlp_multiple, save_models, scores_file

    def on_fit_start(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        """Fail before the expensive stages if a budget cannot be met under the keep ratios.

        Reachability depends on the architecture and the keep ratios, not on the scores, so
        uniform placeholder scores decide it.
        """
        blocks = prunable_blocks(pl_module.backbone)
        placeholder = ElasticScores(
            [torch.zeros(b.heads.num_units) for b in blocks], [torch.zeros(b.neurons.num_units) for b in blocks],
            min_mlp_keep=pl_module.keep_ratios[0], min_head_keep=pl_module.keep_ratios[1],
        )
        cost = CostModel(pl_module.backbone)
        for budget in self.budgets:
            placeholder.subnet(budget, cost, self.mlp_multiple)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        if pl_module.local_scores is None:
            raise SnapViTError("no importance scores were computed: the pruning data loader produced no batch")
        started = time.perf_counter()
        elastic = copy.copy(pl_module.local_scores)
        elastic.coefficients = pl_module.coefficients
        elastic.search = {k: v for k, v in pl_module.summary.get("search", {}).items() if k != "settings"}
        elastic.settings = dict(elastic.settings, search=pl_module.summary.get("search", {}).get("settings"))
        if trainer.is_global_zero:
            elastic.save(pl_module.run_dir / self.scores_file)
        cost = CostModel(pl_module.backbone)
        hooks_s = 0.0  # correction / evaluation of the extracted models, timed by their own callbacks
        pl_module.summary["scores_file"] = self.scores_file
        pl_module.summary["dense"] = {"params": cost.dense_params, "flops": cost.dense_flops, **pl_module.summary.get("dense", {})}
        for budget in self.budgets:
            subnet, mlp_ratio, head_ratio = elastic.subnet(budget, cost, self.mlp_multiple)
            model = prune_(copy.deepcopy(pl_module.backbone), subnet)
            extracted = ExtractedModel(
                budget.label(), {k: v for k, v in vars(budget).items() if v is not None}, subnet, model,
                mlp_ratio, head_ratio, {"params": cost.params(subnet), "flops": cost.flops(subnet)},
            )
            hooks_started = time.perf_counter()
            for _, hook in pl_module.extract_hooks:
                hook(pl_module, extracted)
            hooks_s += time.perf_counter() - hooks_started
            if self.save_models:
                relative = f"models/{extracted.label}"
                if trainer.is_global_zero:
                    save_pruned(extracted.model, pl_module.run_dir / relative, pl_module.spec, subnet, extra={
                        "budget": extracted.budget, "mlp_ratio": mlp_ratio, "head_ratio": head_ratio,
                        "base_fingerprint": pl_module.base_fingerprint, **extracted.info,
                    })
                extracted.info["checkpoint"] = relative
            extracted.model = None  # free memory; the checkpoint holds it
            pl_module.extracted.append(extracted)
        self._log_widths(trainer, pl_module)
        pl_module.summary["timings"]["export_s"] = time.perf_counter() - started - hooks_s

    @staticmethod
    def _log_widths(trainer: pl.Trainer, pl_module: PruningModule) -> None:
        """Kept MLP width and heads per block for every budget, as a TensorBoard figure."""
        experiment = getattr(trainer.logger, "experiment", None)
        if not trainer.is_global_zero or not hasattr(experiment, "add_figure") or not pl_module.extracted:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax_mlp, ax_heads) = plt.subplots(1, 2, figsize=(10, 3.5))
        for item in pl_module.extracted:
            ax_mlp.plot(item.subnet.neuron_counts, marker="o", label=item.label)
            ax_heads.plot(item.subnet.head_counts, marker="o", label=item.label)
        ax_mlp.set(title="kept MLP width", xlabel="block")
        ax_heads.set(title="kept heads", xlabel="block")
        ax_heads.legend(fontsize=6)
        fig.tight_layout()
        experiment.add_figure("export/kept_width_per_block", fig)
        plt.close(fig)
