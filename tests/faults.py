"""Fault injection shared by the tests: damaged files (one flipped bit at many places, a truncation)."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Iterator


def flipped_copies(path: Path, count: int = 40, seed: int = 0) -> Iterator[int]:
    """Flip one bit of ``path`` at ``count`` places spread over the whole file (header and payload), one at a time:
    yields each position with the file damaged there, and restores it afterwards."""
    original = path.read_bytes()
    rng = random.Random(seed)
    positions = sorted({rng.randrange(len(original)) for _ in range(count)} | {0, len(original) // 2, len(original) - 1})
    try:
        for position in positions:
            damaged = bytearray(original)
            damaged[position] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(damaged))
            yield position
    finally:
        path.write_bytes(original)
