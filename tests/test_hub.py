"""Pruned checkpoints on the Hub: pulled through the (offline) cache, pushed up to the network boundary."""
import json

import pytest
import torch

from families import FAMILIES, random_subnet
from hub_cache import snapshot
from snapvit_pl.errors import CheckpointError
from huggingface_hub import ModelCard

from snapvit_pl.hub import main, model_card, push_to_hub
from snapvit_pl.models.publish import base_model_info
from snapvit_pl.models import load_backbone, load_pruned, prune_, save_pruned


@pytest.fixture
def pruned(tmp_path):
    spec = FAMILIES["augreg_vit"]
    model = load_backbone(spec)
    subnet = random_subnet(model, 1)
    extra = {"budget": {"sparsity": 0.5}, "mlp_ratio": 0.6, "head_ratio": 0.45, "params": 12345, "flops": 678901,
             "metrics": {"knn_top1": 0.81, "head_top1": 0.77}, "base_spec": spec.to_dict(),
             "evaluated_on": {"dataset": "fashion_mnist", "split": "val"}}
    return save_pruned(prune_(model, subnet), tmp_path / "sparsity0.5", spec, subnet, extra=extra)


def test_load_pruned_from_the_hub_cache(offline_hub, hf_cache, pruned):
    home, _ = hf_cache
    folder = snapshot(home / "hub", "snapvit-test/pruned")
    for name in ("model.safetensors", "architecture.json"):
        (folder / name).write_bytes((pruned / name).read_bytes())
    model, record = load_pruned("hf-hub:snapvit-test/pruned")
    local, _ = load_pruned(pruned)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), local.state_dict().values()))
    with pytest.raises(CheckpointError, match="could not fetch hf-hub:snapvit-test/absent"):
        load_pruned("hf-hub:snapvit-test/absent")


class FakeApi:
    """What push_to_hub would send: the repository it creates and the files it uploads (no network)."""

    def __init__(self):
        self.created, self.uploaded = [], {}

    def create_repo(self, repo_id, private=False, exist_ok=False):
        self.created.append((repo_id, private, exist_ok))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, folder_path, repo_id, commit_message):
        from pathlib import Path

        self.uploaded = {p.name: p.read_bytes() for p in Path(folder_path).iterdir()}
        self.commit = (repo_id, commit_message)


def test_push_sends_the_checkpoint_and_a_model_card(pruned):
    api = FakeApi()
    url = push_to_hub(pruned, "someone/vit-pruned", private=True, api=api)
    assert url == "https://huggingface.co/someone/vit-pruned" and api.created == [("someone/vit-pruned", True, True)]
    assert set(api.uploaded) == {"model.safetensors", "architecture.json", "README.md"}
    assert api.uploaded["model.safetensors"] == (pruned / "model.safetensors").read_bytes()
    card = api.uploaded["README.md"].decode()
    record = json.loads((pruned / "architecture.json").read_text())
    data = ModelCard(card).data  # huggingface_hub reads the metadata back
    assert data.library_name == "snapvit-pl" and data.base_model == "timm/vit_tiny_patch16_224.augreg_in21k"
    assert data.license == "apache-2.0" and data.pipeline_tag == "image-classification"  # the base model's, 10 classes
    (knn,) = [r for r in data.eval_results if r.metric_name == "weighted k-NN top-1"]
    assert knn.metric_value == 0.81 and knn.dataset_type == "fashion_mnist" and knn.task_type == "image-classification"
    assert "| heads | " + " | ".join(map(str, record["heads"])) + " |" in card and "| parameters | 12,345 |" in card
    assert "| knn_top1 | 0.81 |" in card and 'load_pruned("hf-hub:someone/vit-pruned")' in card
    assert model_card(record, "someone/vit-pruned") == card


def test_a_headless_base_is_feature_extraction_and_a_custom_license_is_other():
    base = {"base": {"model_name": "vit_small_patch16_dinov3", "model_kwargs": {}},
            "extra": {"base_spec": {"model_name": "vit_small_patch16_dinov3.lvd1689m", "model_kwargs": {}}},
            "heads": [6], "mlp_hidden": [1536]}
    assert base_model_info(base) == {"name": "vit_small_patch16_dinov3.lvd1689m", "has_head": False,
                                     "hub_id": "timm/vit_small_patch16_dinov3.lvd1689m", "license": "dinov3-license"}
    data = ModelCard(model_card(base, "org/dinov3-pruned")).data
    assert data.pipeline_tag == "image-feature-extraction" and data.license == "other"
    assert data.license_name == "dinov3-license" and not data.eval_results


def test_card_command_and_bad_repository_names(pruned, capsys):
    assert main(["card", "--checkpoint", str(pruned), "--repo", "org/name"]) == 0
    assert "library_name: snapvit-pl" in capsys.readouterr().out
    assert main(["push", "--checkpoint", str(pruned), "--repo", "no-slash"]) == 2
    assert "must be org/name" in capsys.readouterr().err


def test_a_hub_that_accepts_and_never_answers_ends_the_push_in_bounded_time(pruned, capsys):
    """Issue 48: huggingface_hub's client has no timeout; a server that accepted the connection and never answered held
    `hub push` for ever. Each request now waits --timeout seconds at most: one error line naming the option."""
    import socket
    import threading
    import time

    from huggingface_hub import constants

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted = []
    threading.Thread(target=lambda: [accepted.append(server.accept()) for _ in range(8)], daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    started = time.perf_counter()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "ENDPOINT", endpoint)
        code = main(["push", "--checkpoint", str(pruned), "--repo", "org/name", "--token", "hf_x", "--timeout", "0.5"])
    assert code == 2 and time.perf_counter() - started < 60
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "did not answer within --timeout 0.5 s" in error, error
    assert accepted, "the server was reached (the timeout, not a refused connection, ended the push)"
    server.close()
