"""Simulated DDP for the tests: one thread per rank, ``all_gather`` through a barrier (importable by name)."""
import threading

import torch


def as_ranks(world: int, work):
    """``[work(rank, all_gather) for each rank]``, the ranks run side by side on threads; ``all_gather`` stacks every
    rank's tensor into ``[world, ...]``."""
    barrier, slots, out = threading.Barrier(world), [None] * world, [None] * world

    def gather(rank):
        def all_gather(tensor):
            slots[rank] = tensor.clone()
            barrier.wait()
            stacked = torch.stack(slots)
            barrier.wait()
            return stacked
        return all_gather

    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, work(r, gather(r)))) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
