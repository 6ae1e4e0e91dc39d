"""Building the base ViT: timm hub weights, a local checkpoint file, or random weights."""
from __future__ import annotations

import hashlib
import importlib
import pickle
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import timm
import torch
from safetensors import SafetensorError
from torch import nn

from ..errors import CheckpointError, ConfigError, UnsupportedModelError


@dataclass
class BackboneSpec:
    """How to build the base model; JSON-serialisable so pruned checkpoints can record it.

    Args:
        model_name: a timm model name, with its pretrained tag, e.g. ``"vit_base_patch16_224.dino"``.
        pretrained: load the weights timm knows for ``model_name`` (from the hub or its cache).
        checkpoint_path: a local weights file (``.safetensors``, ``.pth``, ``.bin``) holding the
            complete state dict of this architecture (classifier head included), loaded strictly
            by timm instead of the hub weights. For a hub-format file that needs timm's
            adaptation (other head or channel count), set ``pretrained: true`` and
            ``model_kwargs.pretrained_cfg_overlay: {file: ...}`` instead.
        model_kwargs: architecture overrides passed to ``timm.create_model``
            (e.g. ``img_size``, ``depth``, ``num_classes``); with ``pretrained=False`` and no
            checkpoint this gives a randomly initialised model, as the tests use.
    """

    model_name: str = "vit_small_patch16_224.dino"
    pretrained: bool = True
    checkpoint_path: Optional[str] = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; timm layer classes in ``model_kwargs`` become ``{"class_path": ...}``."""
        return dict(asdict(self), model_kwargs={k: _encode(v) for k, v in self.model_kwargs.items()})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BackboneSpec":
        """Inverse of :meth:`to_dict`."""
        kwargs = {k: _decode(v) for k, v in (data.get("model_kwargs") or {}).items()}
        return cls(data["model_name"], data.get("pretrained", False), data.get("checkpoint_path"), kwargs)

    def architecture_only(self) -> "BackboneSpec":
        """The same architecture with no weights to fetch (weights come from elsewhere).

        An ``hf-hub:org/name`` model is resolved to its timm architecture and arguments (from its
        ``config.json``, downloaded or in the offline cache), so rebuilding it needs no Hub access.
        """
        if self.model_name.startswith(HUB_PREFIX):
            from timm.models._hub import load_model_config_from_hf

            try:
                pretrained_cfg, architecture, model_args = load_model_config_from_hf(self.model_name[len(HUB_PREFIX):])
            except UNREADABLE_CHECKPOINT + (ImportError,) as err:
                raise CheckpointError(f"could not read the config of {self.model_name} ({' '.join(str(err).split())[:200]}); "
                                      "check the name, the network, or the offline Hugging Face cache") from err
            overlay = {k: pretrained_cfg[k] for k in ("mean", "std", "input_size", "interpolation", "crop_pct")
                       if k in pretrained_cfg}
            kwargs = {**model_args, "pretrained_cfg_overlay": overlay, **self.model_kwargs}
            if "num_classes" in pretrained_cfg and "num_classes" not in kwargs:
                kwargs["num_classes"] = pretrained_cfg["num_classes"]
            return BackboneSpec(architecture, pretrained=False, checkpoint_path=None, model_kwargs=kwargs)
        return BackboneSpec(self.model_name, pretrained=False, checkpoint_path=None, model_kwargs=dict(self.model_kwargs))


def _encode(value: Any) -> Any:
    if isinstance(value, type):
        return {"class_path": f"{value.__module__}.{value.__qualname__}"}
    return list(value) if isinstance(value, tuple) else value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"class_path"}:
        module, _, name = value["class_path"].rpartition(".")
        if not (module == "timm" or module.startswith("timm.")):
            raise CheckpointError(f"refusing to import {value['class_path']}: only timm layer classes may be named")
        return getattr(importlib.import_module(module), name)
    return value


HUB_PREFIX = "hf-hub:"  # timm's prefix of a model on the Hugging Face Hub (its config.json names the architecture)

#: What loading a missing, truncated, corrupt or foreign weights file raises (mapped to ``CheckpointError``).
UNREADABLE_CHECKPOINT = (RuntimeError, OSError, ValueError, KeyError, EOFError, SafetensorError, pickle.UnpicklingError)

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def resolve_path(path: str | Path) -> Path:
    """A user path; a relative one missing from the working directory is looked up in the
    snapvit-pl checkout too, so the shipped assets (``assets/...``) work from anywhere."""
    path = Path(path).expanduser()
    if not path.is_absolute() and not path.exists() and (PROJECT_ROOT / path).exists():
        return PROJECT_ROOT / path
    return path


def load_backbone(spec: BackboneSpec | str, **overrides: Any) -> nn.Module:
    """Create a timm model from a :class:`BackboneSpec` (or a model name plus spec fields).

    Raises:
        UnsupportedModelError: ``model_name`` is not a timm model.
        CheckpointError: ``checkpoint_path`` is missing, unreadable, or does not fit the model.
    """
    if isinstance(spec, str):
        spec = BackboneSpec(spec, **overrides)
    base_name = spec.model_name.split(".")[0]
    if not spec.model_name.startswith(HUB_PREFIX) and not timm.is_model(base_name):
        close = timm.list_models(f"*{base_name.split('_')[0]}*")[:8]
        raise UnsupportedModelError(
            f"unknown timm model '{spec.model_name}'; check the name with timm.list_models() (similar: {close})"
        )
    kwargs = {k: _decode(v) for k, v in spec.model_kwargs.items()}
    if spec.checkpoint_path is not None:
        path = resolve_path(spec.checkpoint_path)
        if path.is_dir():
            raise CheckpointError(f"checkpoint_path {path} is a directory; give a weights file (a pruned checkpoint "
                                  "directory is read by --checkpoint / load_pruned)")
        if not path.is_file():
            raise CheckpointError(f"checkpoint file not found: {path}; pass an existing weights file as checkpoint_path")
        kwargs["checkpoint_path"] = str(path)  # timm loads it strictly, classifier head included
    try:
        model = timm.create_model(spec.model_name, pretrained=spec.pretrained and spec.checkpoint_path is None, **kwargs)
    except ImportError as err:
        raise ConfigError(f"{spec.model_name}: {err}; install what it names (pip install ...)") from err
    except TypeError as err:
        raise ConfigError(f"timm model '{spec.model_name}' does not accept these model_kwargs: {err}; fix model_kwargs") from err
    except UNREADABLE_CHECKPOINT as err:
        where = spec.checkpoint_path or f"the hub weights of {spec.model_name}"
        hint = (
            "check that the file is a complete state dict for this architecture (model_kwargs included)"
            if spec.checkpoint_path
            else "no network? download once and pass checkpoint_path, or set pretrained: false"
        )
        raise CheckpointError(f"could not load {where}: {' '.join(str(err).split())[:300]}; {hint}") from err
    check_finite(model, spec.checkpoint_path or spec.model_name)
    return model.eval()


def check_finite(model: nn.Module, source: Any = "the model") -> None:
    """Refuse weights holding NaN or infinity (a damaged file, a diverged training): every score and metric of such a
    model would be meaningless.

    Raises:
        CheckpointError: naming the first such tensors and ``source``.
    """
    bad = [name for name, tensor in model.state_dict().items()
           if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad:
        raise CheckpointError(f"the weights of {source} hold NaN or infinite values ({', '.join(bad[:3])}"
                              f"{' ...' if len(bad) > 3 else ''}); the file is damaged or the training diverged: "
                              "load other weights")


def fingerprint(model: nn.Module) -> str:
    """SHA-256 over the names, shapes, dtypes and bytes of the state dict (identifies the weights)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
