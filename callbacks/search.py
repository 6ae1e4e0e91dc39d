"""xNES search of the cross-block coefficients, after importance estimation."""
from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import pytorch_lightning as pl
import torch
from tqdm.auto import tqdm

from snapvit_pl.elastic import initial_coefficients
from snapvit_pl.lightning.pruning_module import PruningModule
from snapvit_pl.lightning.resume import save_resume_state
from snapvit_pl.search import XNES
from snapvit_pl.search.fitness import DEFAULT_SPARSITY_PAIRS, EmbeddingFitness
from snapvit_pl.search.population import evaluate_population


class SearchCallback(pl.Callback):
    """Learns one coefficient per block (MLP) and per head that rescales the local scores.

    Defaults follow METHOD.md: 50 evaluations, population ``4 + floor(3 ln D)``, identity initial
    covariance, initial mean ``linspace(1.2, 0.8)`` over blocks, 1000 images, PCA to 192 dims.
    Under DDP each rank evaluates its share of every generation (each candidate exactly once);
    the ranks share the seed, so they hold the same search state.

    Args:
        max_evaluations: fitness evaluations (candidates), 0 disables the search.
        popsize: candidates per generation (default from the dimension).
        sigma: initial step size.
        seed: seed of the search.
        num_images: images in the fitness set (plain views of the pruning data).
        batch_size: forward batch size of the fitness.
        pca_components: PCA dimension of the embeddings.
        sparsity_pairs: (mlp_ratio, head_ratio) pairs averaged by the fitness.
        initial_range: initial coefficients go linearly from the first to the last block.
    """

    def __init__(
        self,
        max_evaluations: int = 50,
        popsize: Optional[int] = None,
        sigma: float = 1.0,
        seed: int = 0,
        num_images: int = 1000,
        batch_size: int = 64,
        pca_components: int = 192,
        sparsity_pairs: Sequence[tuple[float, float]] = DEFAULT_SPARSITY_PAIRS,
        initial_range: tuple[float, float] = (1.2, 0.8),
    ):
        if max_evaluations < 0 or num_images < 1 or batch_size < 1:
            raise ValueError("max_evaluations must be >= 0, num_images and batch_size >= 1")
        self.max_evaluations, self.popsize, self.sigma, self.seed = max_evaluations, popsize, sigma, seed
        self.num_images, self.batch_size, self.pca_components = num_images, batch_size, pca_components
        self.sparsity_pairs = [tuple(map(float, pair)) for pair in sparsity_pairs]
        self.initial_range = tuple(initial_range)
        self._state: Optional[dict[str, Any]] = None

    resumable = True

    def settings(self) -> dict[str, Any]:
        keys = ("max_evaluations", "popsize", "sigma", "seed", "num_images", "batch_size", "pca_components", "sparsity_pairs", "initial_range")
        return {k: getattr(self, k) for k in keys}

    def _images(self, trainer: pl.Trainer, device: torch.device) -> torch.Tensor:
        return trainer.datamodule.unlabeled_images(self.num_images, self.batch_size).to(device)

    def on_train_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        started = time.perf_counter()
        local = pl_module.local_scores
        blocks = len(local.head_scores)
        mean = initial_coefficients(blocks, local.heads_per_block, *self.initial_range)
        pl_module.coefficients = mean
        if self.max_evaluations == 0:
            pl_module.summary["search"] = {"evaluations": 0, "best_fitness": None, "settings": self.settings()}
            return
        fitness = EmbeddingFitness(
            pl_module.backbone, self._images(trainer, pl_module.device), local, self.sparsity_pairs,
            self.pca_components, self.batch_size,
        )
        es = XNES(mean, sigma=self.sigma, popsize=self.popsize, seed=self.seed)
        if self._state is not None:
            es.load_state_dict(self._state["xnes"])
            pl_module.summary["search_resumed_at"] = es.evaluations
        initial_fitness = self._state["initial_fitness"] if self._state else fitness(mean)
        rank, world = trainer.global_rank, trainer.world_size
        gather = (lambda t: trainer.strategy.all_gather(t.to(pl_module.device)).reshape(world, -1)) if world > 1 else None
        bar = tqdm(total=self.max_evaluations, initial=es.evaluations, desc="xNES search", dynamic_ncols=True,
                   disable=rank != 0 or not trainer.progress_bar_callback)
        local_evaluations = 0

        def evaluated(index: int, value: float) -> None:
            nonlocal local_evaluations
            local_evaluations += 1
            bar.update(world)

        while es.evaluations < self.max_evaluations:
            candidates = es.ask()[: self.max_evaluations - es.evaluations]
            first = es.evaluations
            values = evaluate_population(candidates, fitness, rank, world, gather, on_evaluation=evaluated)
            es.tell(candidates, values)
            self._log(trainer, es, values, first)
            self._state = {"xnes": es.state_dict(), "initial_fitness": initial_fitness}
            save_resume_state(trainer)
            bar.set_postfix(best=f"{es.best_fitness:.4f}", sigma=f"{es.sigma:.3f}")
        bar.close()
        counts = torch.tensor([local_evaluations])
        per_rank = gather(counts.float()).flatten().long().tolist() if gather else [local_evaluations]
        use_search = es.best_x is not None and es.best_fitness < initial_fitness
        pl_module.coefficients = (es.best_x if use_search else mean).float()
        pl_module.summary["search"] = {
            "evaluations": es.evaluations,
            "best_fitness": min(es.best_fitness, initial_fitness),
            "initial_fitness": initial_fitness,
            "improved_on_initial": use_search,
            "generations": es.generation,
            "evaluations_per_rank": per_rank,
            "forward_s": fitness.forward_seconds,
            "settings": self.settings(),
        }
        pl_module.summary["timings"]["search_s"] = time.perf_counter() - started

    @staticmethod
    def _log(trainer: pl.Trainer, es: XNES, values: torch.Tensor, first: int) -> None:
        if trainer.logger is None:
            return
        for offset, value in enumerate(values.tolist()):
            trainer.logger.log_metrics({"search/fitness": value}, step=first + offset)
        trainer.logger.log_metrics({"search/best_fitness": es.best_fitness, "search/sigma": es.sigma}, step=es.evaluations)

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state or {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._state = dict(state_dict) or None
