"""``python -m snapvit_pl.hub push|card``: the ``hub`` command (:mod:`snapvit_pl.cli.hub`).

The functions behind it: :func:`snapvit_pl.models.publish.push_to_hub` and :func:`~snapvit_pl.models.publish.model_card`
(publishing); :func:`snapvit_pl.models.load_pruned` reads ``hf-hub:org/name`` checkpoints.
"""
import sys

from .cli.hub import main
from .models.publish import model_card, push_to_hub

__all__ = ["main", "model_card", "push_to_hub"]

if __name__ == "__main__":
    sys.exit(main())
