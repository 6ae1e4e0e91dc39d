"""The seed policy: one root seed, every other seed derived from it unless given.

``prune.py``'s ``seed_everything`` is the root. The seeds of the pruning data subset (``data.init_args.seed``),
the scorer's probes (``importance.scorer.init_args.seed``), the search (``search.seed``) and random base weights
(``model.seed``) are ``None`` by default and take the root's value; a seed given explicitly is kept. From Python
an unset seed is :data:`DEFAULT_SEED`.
"""
from __future__ import annotations

from typing import Any, Optional

from .errors import ConfigError
from .ranges import SEED_RANGE, Seed  # noqa: F401  (re-exported: the seeds' range and type belong to the policy)

#: What an unset seed is outside a command line (and what ``seed_everything`` defaults to).
DEFAULT_SEED = 0


def resolve_seed(seed: Optional[int]) -> int:
    """``seed``, or :data:`DEFAULT_SEED` when unset."""
    return DEFAULT_SEED if seed is None else int(seed)


def check_seed(seed: Any) -> None:
    """Refuse a ``seed_everything`` outside the 32-bit range NumPy seeds from (``true``: a random one, ``false``:
    no seeding)."""
    low, high = SEED_RANGE
    if not isinstance(seed, bool) and isinstance(seed, int) and not low <= seed <= high:
        raise ConfigError(f"--seed_everything {seed}: seeds lie in [{low}, {high}] (or true for a random one)")


def root_seed(seed: Any) -> Any:
    """``seed_everything`` as a run uses it: ``true`` becomes a random seed (drawn here, so that the run records it),
    any other value is checked (:func:`check_seed`) and kept."""
    import secrets

    if seed is True:
        return secrets.randbelow(SEED_RANGE[1] + 1)
    check_seed(seed)
    return seed


def derive_seeds(config: Any) -> None:
    """Apply the policy to a parsed ``prune.py`` configuration: every seed left unset takes ``seed_everything``'s
    value."""
    root = config.seed_everything
    if isinstance(root, bool):
        return  # false: nothing seeded (the unset seeds keep snapvit_pl.seeding.DEFAULT_SEED)
    if config.model.seed is None:
        config.model.seed = root  # random base weights: every later command rebuilds them
    if config.search.seed is None:
        config.search.seed = root
    for group in (config.data, config.get("seg_data"), config.importance.scorer):
        init_args = getattr(group, "init_args", None) if group is not None else None
        if init_args is not None and "seed" in init_args and init_args.seed is None:
            init_args.seed = root
