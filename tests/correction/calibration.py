"""What the correction tests share: calibration images, a subnet, a model of a family."""
import torch
import torch.nn.functional as F
from families import FAMILIES

from snapvit_pl.models import Subnet, load_backbone, prunable_blocks


def smooth_images(n, seed):
    """Low-frequency images: the hidden states of a random ViT are then strongly correlated."""
    g = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.randn(n, 3, 4, 4, generator=g), size=32, mode="bilinear", align_corners=False)


def half_subnet(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    blocks = prunable_blocks(model)
    return Subnet([torch.randperm(b.heads.num_units, generator=g)[: b.heads.num_units // 2] for b in blocks],
                  [torch.randperm(b.neurons.num_units, generator=g)[: b.neurons.num_units // 2] for b in blocks])


def model_of(family):
    return load_backbone(FAMILIES[family]).eval()
