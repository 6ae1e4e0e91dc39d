"""The seed policy: one root seed, every other seed derived from it unless given.

``prune.py``'s ``seed_everything`` is the root. The seeds of the pruning data subset (``data.init_args.seed``),
the scorer's probes (``importance.scorer.init_args.seed``), the search (``search.seed``) and random base weights
(``model.seed``) are ``None`` by default and take the root's value; a seed given explicitly is kept. From Python
an unset seed is :data:`DEFAULT_SEED`.
"""
from __future__ import annotations

from typing import Optional

from .ranges import SEED_RANGE, Seed  # noqa: F401  (re-exported: the seeds' range and type belong to the policy)

#: What an unset seed is outside a command line (and what ``seed_everything`` defaults to).
DEFAULT_SEED = 0


def resolve_seed(seed: Optional[int]) -> int:
    """``seed``, or :data:`DEFAULT_SEED` when unset."""
    return DEFAULT_SEED if seed is None else int(seed)
