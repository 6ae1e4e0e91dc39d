"""Building the base ViT: timm hub weights, a local checkpoint file, or random weights."""
from __future__ import annotations

import hashlib
import importlib
import os
import pickle
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Optional

import timm
import torch
from safetensors import SafetensorError
from torch import nn

from ..errors import CheckpointError, ConfigError, UnsupportedModelError, field_error
from ..io import resolve_path, weights_file
from ..ranges import Seed
from ..seeding import resolve_seed


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
        seed: the seed random weights (``pretrained=False``, no checkpoint) are drawn from, so that the
            spec rebuilds the very same model anywhere (``prune.py`` records its ``seed_everything``);
            None: :data:`snapvit_pl.seeding.DEFAULT_SEED` (0), as every unset seed from Python.
    """

    model_name: str = "vit_small_patch16_224.dino"
    pretrained: bool = True
    checkpoint_path: Optional[str] = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    seed: Optional[Seed] = None

    def __post_init__(self) -> None:
        # a relative weights file is recorded as the file it names now (in the working directory, else in the
        # shipped data: resolve_path), so that extract, evaluate and train rebuild the model from any directory
        if self.checkpoint_path is not None and str(self.checkpoint_path) and not os.path.isabs(self.checkpoint_path):
            self.checkpoint_path = str(resolve_path(self.checkpoint_path).absolute())

    @property
    def random_weights(self) -> bool:
        """Whether the weights are drawn at random (nothing to load)."""
        return not self.pretrained and self.checkpoint_path is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; timm layer classes in ``model_kwargs`` become ``{"class_path": ...}``; no ``seed`` key
        when there is none."""
        data = dict(asdict(self), model_kwargs={k: _encode(v) for k, v in self.model_kwargs.items()})
        if data["seed"] is None:
            del data["seed"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "the base model's spec") -> "BackboneSpec":
        """Inverse of :meth:`to_dict`, after checking ``data`` against the spec's schema (:func:`check_spec`;
        ``source`` names the file it was read from in the error)."""
        check_spec(data, source)
        kwargs = {k: _decode(v, f"{source}: base.model_kwargs.{k}") for k, v in (data.get("model_kwargs") or {}).items()}
        return cls(data["model_name"], data.get("pretrained", False), data.get("checkpoint_path"), kwargs,
                   data.get("seed"))

    def architecture_only(self) -> "BackboneSpec":
        """The same architecture with no weights to fetch (weights come from elsewhere).

        An ``hf-hub:org/name`` model is resolved to its timm architecture and arguments (from its
        ``config.json``, downloaded or in the offline cache), so rebuilding it needs no Hub access.
        """
        if self.model_name.startswith(HUB_PREFIX):
            from timm.models._hub import load_model_config_from_hf

            offline = None
            try:
                with hub_access() as offline:
                    pretrained_cfg, architecture, model_args = load_model_config_from_hf(self.model_name[len(HUB_PREFIX):])
            except UNREADABLE_CHECKPOINT + (ImportError,) as err:
                detail = f"{offline} and it is not in the local cache" if offline else " ".join(str(err).split())[:200]
                raise CheckpointError(f"could not read the config of {self.model_name} ({detail}); check the name, "
                                      "the network, or the local Hugging Face cache (HF_HUB_OFFLINE=1 reads only "
                                      "the cache)") from err
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


#: Where the layer classes a recorded spec names may come from (files the tool wrote name no other code).
LAYER_MODULES = ("timm", "torch.nn")
#: Bounds of the numeric architecture arguments a recorded spec may hold (a sanity check before timm builds it).
ARCHITECTURE_BOUNDS = {"depth": (1, 1024), "embed_dim": (1, 65536), "num_heads": (1, 1024), "img_size": (1, 16384),
                       "patch_size": (1, 4096), "in_chans": (1, 1024), "num_classes": (0, 1_000_000),
                       "mlp_ratio": (0, 64), "reg_tokens": (0, 1024)}
_SPEC_FIELDS = {"model_name": str, "pretrained": bool, "checkpoint_path": (str, type(None)), "model_kwargs": dict,
                "seed": (int, type(None))}


def check_spec(data: Any, source: str) -> None:
    """The schema of a recorded :class:`BackboneSpec`: its fields and their types, the numeric architecture
    arguments within :data:`ARCHITECTURE_BOUNDS`, layer classes only from :data:`LAYER_MODULES`.

    Raises:
        CheckpointError: one line naming ``source``, the field, what was found and what is allowed.
    """
    def refuse(field: str, found: Any, allowed: str) -> None:
        raise field_error(source, field, found, allowed)

    if not isinstance(data, dict):
        refuse("the base model", data, "a mapping of model_name, pretrained, checkpoint_path, model_kwargs")
    for key, value in data.items():
        kind = _SPEC_FIELDS.get(key)
        if kind is None:
            refuse(f"base.{key}", value, f"one of the fields {', '.join(_SPEC_FIELDS)}")
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            refuse(f"base.{key}", value, {str: "a string", bool: "true or false", dict: "a mapping"}.get(
                kind, "a string or null" if key == "checkpoint_path" else "an integer or null"))
    if not data.get("model_name"):
        refuse("base.model_name", data.get("model_name"), "a timm model name")
    for key, value in (data.get("model_kwargs") or {}).items():
        low, high = ARCHITECTURE_BOUNDS.get(key, (None, None))
        if high is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and \
                not low <= value <= high:
            refuse(f"base.model_kwargs.{key}", value, f"a number in [{low}, {high}]")
        if isinstance(value, dict) and "class_path" in value:
            path = value["class_path"]
            if set(value) != {"class_path"} or not isinstance(path, str) or not any(
                    path.startswith(module + ".") for module in LAYER_MODULES):
                refuse(f"base.model_kwargs.{key}", value, f"a layer class of {' or '.join(LAYER_MODULES)}")


def _decode(value: Any, field: str) -> Any:
    if isinstance(value, dict) and set(value) == {"class_path"}:
        module, _, name = value["class_path"].rpartition(".")
        if not any(module == m or module.startswith(m + ".") for m in LAYER_MODULES):
            raise CheckpointError(f"{field}: refusing to import {value['class_path']}: only timm and torch.nn layer "
                                  "classes may be named")
        layer = getattr(importlib.import_module(module), name, None)
        if not (isinstance(layer, type) and issubclass(layer, torch.nn.Module)):
            raise CheckpointError(f"{field}: {value['class_path']} is not a layer class")
        return layer
    return value


HUB_PREFIX = "hf-hub:"  # timm's prefix of a model on the Hugging Face Hub (its config.json names the architecture)

#: What loading a missing, truncated, corrupt or foreign weights file raises (mapped to ``CheckpointError``).
UNREADABLE_CHECKPOINT = (RuntimeError, OSError, ValueError, KeyError, EOFError, SafetensorError, pickle.UnpicklingError)
#: Seconds the Hugging Face Hub has to answer before only its local cache is read.
HUB_TIMEOUT = 3.0
#: What to do when hub weights cannot be had (the end of the one error line).
HUB_HINT = ("without network they must be in the local Hugging Face cache (download them once; HF_HUB_OFFLINE=1 then "
            "reads only the cache), or give a local weights file as model.checkpoint_path, or use random weights with "
            "model.pretrained: false")


#: Seconds any one connection, read or write of a Hub request may wait (the client's own default: for ever).
HTTP_TIMEOUT = 60.0


@contextmanager
def http_timeout(seconds: float = HTTP_TIMEOUT) -> Iterator[None]:
    """``huggingface_hub``'s HTTP requests inside this block wait at most ``seconds`` to connect and for each read or
    write (its client sets no timeout: a server that accepts the connection and never answers held a push for
    ever), a timeout given to a request by the library itself still applying. The library's client (or ``requests``
    session, before huggingface_hub 1.0) is built anew inside the block and again after it."""
    from huggingface_hub.utils import _http

    if hasattr(_http, "set_client_factory"):  # huggingface_hub >= 1.0: one shared httpx client
        previous = _http._GLOBAL_CLIENT_FACTORY
        timeout = _http.httpx2.Timeout(seconds) if hasattr(_http, "httpx2") else seconds

        def client_factory():
            client = previous()
            client.timeout = timeout
            build = client.build_request

            def build_request(*args, **kwargs):
                if kwargs.get("timeout", timeout) is None:  # "no timeout", said by the library: ours
                    kwargs["timeout"] = timeout
                return build(*args, **kwargs)

            client.build_request = build_request
            return client

        _http.set_client_factory(client_factory)
        try:
            yield
        finally:
            _http.set_client_factory(previous)
        return
    previous = _http._GLOBAL_BACKEND_FACTORY  # requests: a session per thread, each request's timeout by default

    def backend_factory():
        session = previous()
        request = session.request

        def timed(method, url, **kwargs):
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = seconds
            return request(method, url, **kwargs)

        session.request = timed
        return session

    _http.configure_http_backend(backend_factory)
    try:
        yield
    finally:
        _http.configure_http_backend(previous)


@contextmanager
def hub_access() -> Iterator[Optional[str]]:
    """Hub downloads inside this block go to the Hugging Face Hub when it answers within :data:`HUB_TIMEOUT` s,
    else read only the local cache (as ``HF_HUB_OFFLINE=1``), so that no network fails fast instead of after
    minutes of retries. Yields None, or why only the cache is read."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        yield "HF_HUB_OFFLINE is set"
        return
    try:
        from huggingface_hub.utils import get_session

        get_session().head(constants.ENDPOINT, timeout=HUB_TIMEOUT)  # any HTTP answer: reachable
        reachable = True
    except Exception:  # noqa: BLE001 (no route, no name, refused, timed out, proxy errors: all mean no Hub)
        reachable = False
    if reachable:
        with http_timeout():
            yield None
        return
    constants.HF_HUB_OFFLINE = True
    try:
        yield f"{constants.ENDPOINT} did not answer within {HUB_TIMEOUT:g} s"
    finally:
        constants.HF_HUB_OFFLINE = False


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
    kwargs = {k: _decode(v, f"model.model_kwargs.{k}") for k, v in spec.model_kwargs.items()}
    if spec.checkpoint_path is not None:
        kwargs["checkpoint_path"] = str(weights_file(spec.checkpoint_path))  # timm loads it strictly, head included
    from_hub = spec.model_name.startswith(HUB_PREFIX) or (spec.pretrained and spec.checkpoint_path is None)
    offline = None
    try:
        with hub_access() if from_hub else nullcontext() as offline:
            if spec.random_weights:
                with torch.random.fork_rng(devices=[]):  # the same weights for the same seed, the global RNG untouched
                    torch.manual_seed(resolve_seed(spec.seed))
                    model = timm.create_model(spec.model_name, pretrained=False, **kwargs)
            else:
                model = timm.create_model(spec.model_name, pretrained=spec.pretrained and spec.checkpoint_path is None,
                                          **kwargs)
    except ImportError as err:
        raise ConfigError(f"{spec.model_name}: {err}; install what it names (pip install ...)") from err
    except (TypeError, AssertionError) as err:  # (timm asserts on some shapes, e.g. input_size)
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise ConfigError(f"timm model '{spec.model_name}' does not accept these model_kwargs: {reason}; fix "
                          "model_kwargs") from err
    except UNREADABLE_CHECKPOINT as err:
        if not from_hub and not spec.checkpoint_path:  # nothing was read: timm refused the arguments
            raise ConfigError(f"timm model '{spec.model_name}' cannot be built with these model_kwargs: "
                              f"{' '.join(str(err).split())[:200] or type(err).__name__}; fix model_kwargs") from err
        if spec.checkpoint_path:
            raise CheckpointError(f"could not load {spec.checkpoint_path}: {' '.join(str(err).split())[:300]}; check "
                                  "that the file is a complete state dict for this architecture (model_kwargs "
                                  "included)") from err
        detail = f"{offline} and they are not in the local cache" if offline else " ".join(str(err).split())[:200]
        raise CheckpointError(f"could not load the hub weights of {spec.model_name} ({detail}); {HUB_HINT}") from err
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
