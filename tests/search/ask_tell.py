"""The plain ask/evaluate/tell loop the optimiser tests drive (the library's loop is snapvit_pl.search.run_search)."""
import torch


def minimize(es, fn, max_evals, callback=None):
    """Run ``es`` on ``fn`` (one candidate -> float) until ``max_evals`` evaluations (the last generation truncated),
    or until ``callback(es)`` returns True; returns ``(best_x, best_fitness)``."""
    while es.evaluations < max_evals:
        samples = es.ask()[: max_evals - es.evaluations]
        es.tell(samples, torch.tensor([float(fn(x)) for x in samples], dtype=es.dtype))
        if callback is not None and callback(es):
            break
    return es.best_x, es.best_fitness
