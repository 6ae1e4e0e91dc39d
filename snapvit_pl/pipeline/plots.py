"""Figures of a run (matplotlib, headless)."""
from __future__ import annotations

from typing import Sequence

from .state import ExtractedModel


def kept_widths_figure(extracted: Sequence[ExtractedModel]):
    """Kept MLP width and heads per block for every extracted model (a matplotlib Figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_mlp, ax_heads) = plt.subplots(1, 2, figsize=(10, 3.5))
    for item in extracted:
        ax_mlp.plot(item.subnet.neuron_counts, marker="o", label=item.label)
        ax_heads.plot(item.subnet.head_counts, marker="o", label=item.label)
    ax_mlp.set(title="kept MLP width", xlabel="block")
    ax_heads.set(title="kept heads", xlabel="block")
    ax_heads.legend(fontsize=6)
    fig.tight_layout()
    return fig
