"""Transforms resolved from a timm model's data config: eval views, multi-crop views, joint
image/mask transforms for segmentation."""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Optional, Union

import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config
from timm.data.transforms import str_to_interp_mode
from timm.models import get_pretrained_cfg
from torch import nn
from torchvision import transforms as T
from torchvision import tv_tensors
from torchvision.transforms import v2

from ..errors import DataError

#: SnapViT's multi-crop views: 2 global crops of 25-100% and 10 local crops of 5-25% of the image.
N_GLOBAL_VIEWS, N_LOCAL_VIEWS = 2, 10
GLOBAL_CROP_SCALE: tuple[float, float] = (0.25, 1.0)
LOCAL_CROP_SCALE: tuple[float, float] = (0.05, 0.25)

_APPLIED_AFTER_TIMM = ("input_size", "img_size", "in_chans", "mean", "std")


def _model_input_size(model: nn.Module) -> tuple[Optional[int], Optional[tuple[int, int]]]:
    """(in_chans, (H, W)) read from the model's first conv and its patch embedding, if any."""
    first_conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    in_chans = first_conv.in_channels if first_conv is not None else None
    img_size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if isinstance(img_size, int):
        img_size = (img_size, img_size)
    return in_chans, (tuple(img_size) if img_size is not None else None)


def _match_channels(values: tuple[float, ...], in_chans: int, name: str) -> tuple[float, ...]:
    """Fit a per-channel mean/std to in_chans: repeat a single value, average RGB for 1 channel."""
    values = tuple(float(v) for v in values)
    if len(values) == in_chans:
        return values
    if len(values) == 1:
        return values * in_chans
    if in_chans == 1:
        return (sum(values) / len(values),)
    raise DataError(f"data config {name} has {len(values)} values but the model takes {in_chans} channels; "
                    f"give {in_chans} values in data_config.{name}")


def resolve_input_config(
    model: Union[nn.Module, Mapping[str, Any], None] = None,
    model_name: Optional[str] = None,
    overrides: Optional[Mapping[str, Any]] = None,
) -> dict[str, Any]:
    """Resolve the input pipeline of a model with timm's data config rules.

    The model's own input size and channel count (first conv, ``patch_embed.img_size``) win over
    its pretrained_cfg, so a ViT built with ``img_size=28, in_chans=1`` gets 1x28x28 inputs;
    mean/std are then fitted to the channel count.

    Args:
        model: a timm model, or its pretrained_cfg / data-config dict.
        model_name: timm model name whose registered pretrained_cfg is used when no model is given.
        overrides: timm data-config keys (input_size, img_size, in_chans, mean, std,
            interpolation, crop_pct, crop_mode) applied last.

    Returns:
        dict with input_size (C, H, W), interpolation, mean, std, crop_pct, crop_mode.
    """
    pretrained_cfg: dict[str, Any] = {}
    in_chans, hw = None, None
    if isinstance(model, nn.Module):
        pretrained_cfg = dict(getattr(model, "pretrained_cfg", None) or {})
        in_chans, hw = _model_input_size(model)
    elif isinstance(model, Mapping):
        pretrained_cfg = dict(model)
    elif model_name:
        cfg = get_pretrained_cfg(model_name)
        if cfg is None:
            raise DataError(f"timm has no pretrained config for model_name {model_name!r}; "
                            "use a name listed by timm.list_pretrained() or set data_config")
        pretrained_cfg = cfg.to_dict()
    overrides = dict(overrides or {})
    channels, height, width = pretrained_cfg.get("input_size") or (3, 224, 224)
    channels, (height, width) = in_chans or channels, hw or (height, width)
    if overrides.get("input_size") is not None:
        channels, height, width = overrides["input_size"]
    if overrides.get("img_size") is not None:
        size = overrides["img_size"]
        height, width = (size, size) if isinstance(size, int) else size
    if overrides.get("in_chans") is not None:
        channels = overrides["in_chans"]
    args = {k: v for k, v in overrides.items() if k not in _APPLIED_AFTER_TIMM}
    args["input_size"] = (int(channels), int(height), int(width))
    config = resolve_data_config(args=args, pretrained_cfg=pretrained_cfg)
    for key in ("mean", "std"):
        config[key] = _match_channels(overrides.get(key) or config[key], int(channels), key)
    return config


class ConvertChannels:
    """PIL image to the model's channel count: mode "L" for 1 channel, "RGB" for 3.

    Args:
        in_chans: 1 or 3.
    """

    def __init__(self, in_chans: int):
        if in_chans not in (1, 3):
            raise DataError(f"images can be converted to 1 or 3 channels, the model takes {in_chans}; "
                            "use a model with in_chans 1 or 3")
        self.mode = "L" if in_chans == 1 else "RGB"

    def __call__(self, image: Image.Image) -> Image.Image:
        return image if image.mode == self.mode else image.convert(self.mode)


_RESERVED_AUGMENT_ARGS = ("input_size", "is_training", "interpolation", "mean", "std", "crop_pct", "crop_mode")


def check_augment_args(augment_args: Mapping[str, Any]) -> None:
    """Raise DataError unless every key is a ``timm.data.create_transform`` argument that the
    data config does not already set."""
    accepted = set(inspect.signature(create_transform).parameters) - set(_RESERVED_AUGMENT_ARGS)
    unknown = sorted(set(augment_args) - accepted)
    if unknown:
        raise DataError(f"train_augment_args has unknown keys {unknown}; use arguments of "
                        f"timm.data.create_transform other than the data config's, e.g. scale, ratio, hflip, "
                        f"color_jitter, auto_augment, re_prob")


def classification_transform(config: Mapping[str, Any], train_augment: bool = False,
                             **augment_args: Any) -> T.Compose:
    """timm's eval (or train) transform for a data config, after the channel conversion.

    Args:
        config: output of resolve_input_config.
        train_augment: timm's training augmentation instead of resize + center crop.
        augment_args: further ``timm.data.create_transform`` arguments for the training
            augmentation (scale, ratio, hflip, color_jitter, ...).
    """
    check_augment_args(augment_args)
    timm_transform = create_transform(
        input_size=config["input_size"], is_training=train_augment, interpolation=config["interpolation"],
        mean=config["mean"], std=config["std"], crop_pct=config["crop_pct"], crop_mode=config["crop_mode"],
        **augment_args,
    )
    return T.Compose([ConvertChannels(config["input_size"][0]), timm_transform])


class MultiCropTransform:
    """Global and local RandomResizedCrops of one image, all at the model input size.

    Args:
        config: output of resolve_input_config.
        n_global: number of global crops.
        n_local: number of local crops.
        global_scale: area range of the global crops.
        local_scale: area range of the local crops.
        color_jitter: brightness/contrast/saturation jitter strength (0 disables it).
        hflip: probability of a horizontal flip of each view (0: none, SnapViT's scoring views).

    Returns (when called on a PIL image): tensor [n_global + n_local, C, H, W], normalised.
    """

    def __init__(self, config: Mapping[str, Any], n_global: int = N_GLOBAL_VIEWS, n_local: int = N_LOCAL_VIEWS,
                 global_scale: tuple[float, float] = GLOBAL_CROP_SCALE, local_scale: tuple[float, float] = LOCAL_CROP_SCALE,
                 color_jitter: float = 0.0, hflip: float = 0.0):
        if n_global + n_local < 1:
            raise DataError(f"multi-crop needs at least one view, got n_global={n_global}, n_local={n_local}; "
                            "set n_global_views or n_local_views >= 1")
        self.n_global, self.n_local = n_global, n_local
        self.global_crop = self._crop(config, global_scale, color_jitter, hflip)
        self.local_crop = self._crop(config, local_scale, color_jitter, hflip)

    @staticmethod
    def _crop(config: Mapping[str, Any], scale: tuple[float, float], color_jitter: float, hflip: float) -> T.Compose:
        channels, height, width = config["input_size"]
        steps = [ConvertChannels(channels),
                 T.RandomResizedCrop((height, width), scale=tuple(scale),
                                     interpolation=str_to_interp_mode(config["interpolation"]))]
        if hflip > 0:
            steps.append(T.RandomHorizontalFlip(hflip))
        if color_jitter > 0:
            steps.append(T.ColorJitter(color_jitter, color_jitter, color_jitter))
        steps += [T.ToTensor(), T.Normalize(config["mean"], config["std"])]
        return T.Compose(steps)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        views = [self.global_crop(image) for _ in range(self.n_global)]
        views += [self.local_crop(image) for _ in range(self.n_local)]
        return torch.stack(views)


class BatchMultiCrop:
    """Multi-crop views of a batch of already-normalised image tensors, seeded per image.

    The tensor counterpart of :class:`MultiCropTransform` for callers that hold plain batches
    ``[B, C, H, W]`` (e.g. :func:`snapvit_pl.fit_elastic` given a plain DataLoader): every view is a
    random resized crop of the image, resized back to ``H x W`` (bilinear; resizing commutes with the
    per-channel normalisation). Image ``i`` of the ``n``-th image seen gets crops seeded by
    ``(seed, n)``, so the views do not depend on the batching.

    Args:
        n_global, n_local, global_scale, local_scale: as for :class:`MultiCropTransform`.
        seed: base seed of the crops.

    Returns (when called): ``[B, n_global + n_local, C, H, W]``.
    """

    def __init__(self, n_global: int = N_GLOBAL_VIEWS, n_local: int = N_LOCAL_VIEWS,
                 global_scale: tuple[float, float] = GLOBAL_CROP_SCALE, local_scale: tuple[float, float] = LOCAL_CROP_SCALE,
                 seed: int = 0):
        if n_global + n_local < 1:
            raise DataError(f"multi-crop needs at least one view, got n_global={n_global}, n_local={n_local}")
        self.scales = [tuple(global_scale)] * n_global + [tuple(local_scale)] * n_local
        self.seed, self.seen = seed, 0

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4:
            raise DataError(f"BatchMultiCrop takes plain batches [B, C, H, W], got shape {tuple(images.shape)}")
        size = list(images.shape[-2:])
        batch = []
        for image in images:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.seen)
            self.seen += 1
            views = []
            for scale in self.scales:
                top, left, height, width = _crop_params(size, scale, generator)
                views.append(v2.functional.resized_crop(image, top, left, height, width, size, antialias=True))
            batch.append(torch.stack(views))
        return torch.stack(batch)


def _crop_params(size: list[int], scale: tuple[float, float], generator: torch.Generator,
                 ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop parameters (area in ``scale``, aspect in ``ratio``) from ``generator``."""
    height, width = size
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=generator)).item()
        w, h = int(round((target * aspect) ** 0.5)), int(round((target / aspect) ** 0.5))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            return top, left, h, w
    return 0, 0, height, width  # fallback: the whole image


class SegmentationTransform:
    """Joint image/mask transform: resize to the model input (or random resized crop + flip for
    training), masks with nearest interpolation so class and ignore values stay intact.

    Args:
        config: output of resolve_input_config.
        train_augment: RandomResizedCrop(scale 0.5-1) and horizontal flip instead of a resize.

    Returns (when called on a PIL image and an integer mask [H, W]): image [C, H, W] normalised,
    mask [H, W] int64; called on an image alone it returns the image.
    """

    def __init__(self, config: Mapping[str, Any], train_augment: bool = False):
        channels, height, width = config["input_size"]
        interpolation = str_to_interp_mode(config["interpolation"])
        if train_augment:
            spatial = [v2.RandomResizedCrop((height, width), scale=(0.5, 1.0), interpolation=interpolation),
                       v2.RandomHorizontalFlip()]
        else:
            spatial = [v2.Resize((height, width), interpolation=interpolation)]
        self.convert = ConvertChannels(channels)
        self.pipeline = v2.Compose([v2.ToImage(), *spatial, v2.ToDtype(torch.float32, scale=True),
                                    v2.Normalize(config["mean"], config["std"])])

    def __call__(self, image: Image.Image, mask: Optional[torch.Tensor] = None):
        if mask is None:
            return self.pipeline(self.convert(image)).as_subclass(torch.Tensor)
        image, mask = self.pipeline(self.convert(image), tv_tensors.Mask(mask))
        return image.as_subclass(torch.Tensor), mask.as_subclass(torch.Tensor).long()
