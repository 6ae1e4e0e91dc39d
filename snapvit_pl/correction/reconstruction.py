"""Block-wise reconstruction: gradient steps on one pruned block toward the dense block's output, after its
least-squares fit (``correction.reconstruct_steps``), stopped when a held-out error stops improving."""
from __future__ import annotations

import time
from typing import Optional

import torch
from torch import nn

from .calibration import BATCH_SIZE
from .settings import RECONSTRUCT_LR, RECONSTRUCT_PATIENCE


class Reconstruction:
    """Block-wise reconstruction: gradient steps (Adam) on every parameter of one pruned block so that its output on
    the pruned stream matches the dense block's output, after the block's least-squares fit.

    Label-free and on the calibration images only. The steps draw from the images the fit used; the error on the
    held-out ones (images neither the fit nor the steps see) is measured every ``check_every`` steps, and the block
    keeps the parameters of the lowest held-out error seen (the fit's own, when no step improves on it). The steps
    stop early once ``patience`` steps pass without a lower held-out error, or when the block's share of ``seconds``
    is spent.

    Args:
        steps: at most this many gradient steps per block (0: none).
        lr: Adam's learning rate.
        batch_size: images per step.
        check_every: steps between two held-out checks.
        patience: stop after this many steps without a lower held-out error (None: run every step).
        seconds: at most this many seconds of steps per corrected model, shared evenly by the blocks still to
            step (None: no limit; a time limit makes the steps taken depend on the machine's speed).
    """

    def __init__(self, steps: int, lr: float = RECONSTRUCT_LR, batch_size: int = BATCH_SIZE, check_every: int = 25,
                 patience: Optional[int] = RECONSTRUCT_PATIENCE, seconds: Optional[float] = None):
        self.steps, self.lr, self.batch_size, self.check_every = steps, lr, batch_size, check_every
        self.patience, self.seconds = patience, seconds
        self.log: list[dict[str, float]] = []  # per block: held-out error before and after, steps kept and run
        self._spent = 0.0

    def start_model(self) -> None:
        """Starts a new model's time budget (``seconds``)."""
        self._spent = 0.0

    def run(self, block: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, kwargs: dict, seed: int = 0,
            train: Optional[slice] = None, check: Optional[slice] = None, blocks_left: int = 1) -> float:
        """Steps ``block`` toward ``targets`` (the dense block's outputs) from ``inputs`` (the pruned stream), drawing
        batches from the rows ``train`` and keeping the best parameters on the rows ``check`` (default: every row
        for both). ``blocks_left``: the blocks still to step in this model, this one included (their share of the
        time budget). Returns the kept parameters' error on ``check``."""
        train = train if train is not None else slice(0, len(inputs))
        check = check if check is not None else train
        count = len(range(*train.indices(len(inputs))))
        best = self.error(block, inputs[check], targets[check], kwargs)
        if count < 1 or self.steps <= 0:
            return best
        deadline = None if self.seconds is None else \
            time.perf_counter() + max(0.0, self.seconds - self._spent) / max(1, blocks_left)
        started = time.perf_counter()
        generator = torch.Generator().manual_seed(seed)
        params = list(block.parameters())
        wanted = [p.requires_grad for p in params]
        for p in params:
            p.requires_grad_(True)
        optimizer = torch.optim.Adam(params, lr=self.lr)
        start, kept, ran, best_state = best, 0, 0, [p.detach().clone() for p in params]
        try:
            with torch.enable_grad():
                for step in range(1, self.steps + 1):
                    index = torch.randint(0, count, (min(self.batch_size, count),), generator=generator)
                    index = index.to(inputs.device)
                    loss = torch.nn.functional.mse_loss(block(inputs[train][index], **kwargs), targets[train][index])
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    ran = step
                    out_of_time = deadline is not None and time.perf_counter() >= deadline
                    if step % self.check_every == 0 or step == self.steps or out_of_time:
                        error = self.error(block, inputs[check], targets[check], kwargs)
                        if error < best:
                            best, kept, best_state = error, step, [p.detach().clone() for p in params]
                        elif self.patience is not None and step - kept >= self.patience:
                            break
                    if out_of_time:
                        break
        finally:
            with torch.no_grad():
                for p, value, flag in zip(params, best_state, wanted):
                    p.copy_(value)
                    p.requires_grad_(flag)
                    p.grad = None
            self._spent += time.perf_counter() - started
        self.log.append({"held_out_error_before": start, "held_out_error_after": best, "steps_kept": kept,
                         "steps_run": ran})
        return best

    @torch.no_grad()
    def error(self, block: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, kwargs: dict) -> float:
        """Mean squared error of ``block(inputs)`` against ``targets``, batch by batch."""
        return block_error(block, inputs, targets, kwargs, self.batch_size)


#: Without held-out images, the share of the fit's own images the steps keep their best step on.
CHECK_SHARE = 0.1


def tail_aside(rows: int) -> tuple[slice, slice]:
    """``(train, check)`` rows of the steps when no image was held out before the fit: the last tenth of the fit's
    images checked (at least one; every image when there is only one). The fit has seen them, so this check is
    biased toward the fit: ``correction.held_out`` sets images aside before anything is fitted."""
    aside = max(1, round(rows * CHECK_SHARE)) if rows > 1 else 0
    return (slice(0, rows - aside), slice(rows - aside, rows)) if aside else (slice(0, rows), slice(0, rows))


@torch.no_grad()
def block_error(block: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, kwargs: dict,
                batch_size: int = BATCH_SIZE) -> float:
    """Mean squared error of ``block(inputs)`` against ``targets`` (nan when there are no rows)."""
    if len(inputs) == 0:
        return float("nan")
    total = 0.0
    for i in range(0, len(inputs), batch_size):
        out = block(inputs[i:i + batch_size], **kwargs)
        total += float(torch.nn.functional.mse_loss(out.float(), targets[i:i + batch_size].float(), reduction="sum"))
    return total / targets.numel()
