"""Temporary model states: eval mode, timm attention on its explicit path; both restored afterwards."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn


@contextmanager
def eval_mode(*modules: nn.Module) -> Iterator[None]:
    """Run in eval mode (no dropout/drop-path), restoring each submodule's own train/eval flag afterwards."""
    flags = [(m, m.training) for module in modules for m in module.modules()]
    try:
        for module in modules:
            module.eval()
        yield
    finally:
        for m, flag in flags:
            m.training = flag


@contextmanager
def manual_attention(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily switch every timm attention module to its explicit (non-SDPA) path."""
    saved = [(m, m.fused_attn) for m in model.modules() if hasattr(m, "fused_attn")]
    try:
        for module, _ in saved:
            module.fused_attn = False
        yield model
    finally:
        for module, fused in saved:
            module.fused_attn = fused


@contextmanager
def frozen(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily mark every parameter ``requires_grad=False`` (each one's own flag is restored).

    Needed by ``torch.utils.flop_counter``: under ``no_grad`` a module that builds a tensor from a
    parameter that requires grad (SigLIP2's ``attn_pool.latent.expand``) trips its module tracker.
    """
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
