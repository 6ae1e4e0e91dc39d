import json

import pytest
import torch
from safetensors.torch import save_file

from families import FAMILIES, random_subnet
from snapvit_pl.errors import CheckpointError, ConfigError, UnsupportedModelError
from snapvit_pl.io import verify_checksum, with_checksum
from snapvit_pl.models import BackboneSpec, fingerprint, load_backbone, load_pruned, prune_, save_pruned


def _leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_load_pruned_round_trips_to_identical_outputs(tmp_path, family):
    spec = FAMILIES[family]
    model = load_backbone(spec)
    subnet = random_subnet(model, 7)
    prune_(model, subnet)
    save_pruned(model, tmp_path / "ckpt", spec, subnet, extra={"mlp_ratio": 0.5})
    loaded, record = load_pruned(tmp_path / "ckpt")
    x = torch.randn(2, model.patch_embed.proj.in_channels, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))
    assert record["heads"] == subnet.head_counts and record["extra"] == {"mlp_ratio": 0.5}
    assert _leftovers(tmp_path) == []


def test_record_is_plain_json_without_pickles(tmp_path):
    spec = FAMILIES["vit_swiglu"]  # model_kwargs holds a class: stored by name
    model = prune_(load_backbone(spec), random_subnet(load_backbone(spec), 1))
    save_pruned(model, tmp_path / "ckpt", spec)
    record = json.loads((tmp_path / "ckpt" / "architecture.json").read_text())
    assert record["base"]["model_kwargs"]["mlp_layer"] == {"class_path": "timm.layers.mlp.SwiGLU"}
    assert record["base"]["pretrained"] is False
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["architecture.json", "model.safetensors"]


@pytest.fixture
def saved(tmp_path):
    spec = FAMILIES["dino_vit"]
    model = load_backbone(spec)
    prune_(model, random_subnet(model, 2))
    return save_pruned(model, tmp_path / "ckpt", spec)


def _edit_record(path, **changes):
    """Edit the record and seal it again with its checksum (what the checks below it must still catch)."""
    record_path = path / "architecture.json"
    record = verify_checksum(json.loads(record_path.read_text()), record_path, "")
    record.update(changes)
    record_path.write_text(json.dumps(with_checksum(record)))


def test_record_edited_without_its_checksum_is_refused(saved):
    record_path = saved / "architecture.json"
    record = json.loads(record_path.read_text())
    record["extra"] = {"metrics": {"knn_top1": 0.99}}  # valid JSON, the weights intact: only the checksum tells
    record_path.write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        load_pruned(saved)
    record_path.write_text(json.dumps({k: v for k, v in record.items() if k != "sha256"}))
    with pytest.raises(CheckpointError, match="carries no checksum"):
        load_pruned(saved)


def test_record_that_disagrees_with_weights(saved):
    record = json.loads((saved / "architecture.json").read_text())
    _edit_record(saved, mlp_hidden=[n - 1 for n in record["mlp_hidden"]])
    with pytest.raises(CheckpointError, match="do not match record"):
        load_pruned(saved)


def test_record_for_another_base_model(saved):
    record = json.loads((saved / "architecture.json").read_text())
    _edit_record(saved, base=dict(record["base"], model_kwargs=dict(record["base"]["model_kwargs"], depth=3)))
    with pytest.raises(CheckpointError, match="does not fit its base model"):
        load_pruned(saved)


def test_truncated_weights_are_detected(saved):
    weights = saved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="checksum"):
        load_pruned(saved)


def test_corrupt_record_and_missing_files(saved, tmp_path):
    (saved / "architecture.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_pruned(saved)
    with pytest.raises(CheckpointError, match="architecture.json not found"):
        load_pruned(tmp_path / "nowhere")


def test_failed_save_leaves_no_partial_files(tmp_path):
    spec = FAMILIES["dino_vit"]
    model = load_backbone(spec)
    with pytest.raises(CheckpointError, match="JSON-serialisable"):
        save_pruned(model, tmp_path / "ckpt", spec, extra={"bad": object()})
    assert list(tmp_path.iterdir()) == []


def test_overwrite_refused_unless_asked(saved):
    model, _ = load_pruned(saved)
    with pytest.raises(ConfigError, match="overwrite"):
        save_pruned(model, saved, FAMILIES["dino_vit"], overwrite=False)
    save_pruned(model, saved, FAMILIES["dino_vit"], overwrite=True)
    assert _leftovers(saved.parent) == []


def test_load_backbone_from_local_checkpoint_file(tmp_path):
    spec = FAMILIES["augreg_vit"]  # 10-class head: it must be loaded from the file, not re-initialised
    source = load_backbone(spec)
    save_file(source.state_dict(), str(tmp_path / "weights.safetensors"))
    loaded = load_backbone(BackboneSpec(spec.model_name, False, str(tmp_path / "weights.safetensors"), spec.model_kwargs))
    assert fingerprint(loaded) == fingerprint(source)
    assert fingerprint(load_backbone(spec)) == fingerprint(source)  # an unset seed is 0: the same random weights
    assert fingerprint(load_backbone(BackboneSpec(spec.model_name, False, None, spec.model_kwargs, seed=1))) != \
        fingerprint(source)


def test_load_backbone_bad_inputs(tmp_path):
    with pytest.raises(UnsupportedModelError, match="unknown timm model 'vit_nonexistent_model'"):
        load_backbone(BackboneSpec("vit_nonexistent_model", pretrained=False))
    with pytest.raises(CheckpointError, match="checkpoint file not found"):
        load_backbone(BackboneSpec("vit_small_patch16_224", False, str(tmp_path / "missing.pth"), FAMILIES["dino_vit"].model_kwargs))
    (tmp_path / "garbage.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="could not load"):
        load_backbone(BackboneSpec("vit_small_patch16_224", False, str(tmp_path / "garbage.pth"), FAMILIES["dino_vit"].model_kwargs))


def test_random_weights_are_a_function_of_the_recorded_seed():
    """``pretrained: false`` with a seed: every command that rebuilds the spec (from its record) gets the same weights,
    whatever the global RNG holds, and building it leaves the global RNG alone."""
    spec = BackboneSpec("vit_small_patch16_224", False, None, FAMILIES["dino_vit"].model_kwargs, seed=3)
    first = fingerprint(load_backbone(spec))
    torch.manual_seed(123)
    state = torch.get_rng_state()
    rebuilt = load_backbone(BackboneSpec.from_dict(json.loads(json.dumps(spec.to_dict()))))
    assert fingerprint(rebuilt) == first and torch.equal(torch.get_rng_state(), state)
    assert fingerprint(load_backbone(BackboneSpec(**{**vars(spec), "seed": 4}))) != first
    assert "seed" not in FAMILIES["dino_vit"].to_dict()  # no seed: records as before


def test_hub_weights_without_network_fail_fast_in_one_line_naming_the_ways_out(tmp_path, monkeypatch):
    """No answer from the Hub and nothing in the cache: no minutes of retries, one message naming
    HF_HUB_OFFLINE=1, checkpoint_path and pretrained: false."""
    import time

    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    started = time.perf_counter()
    with pytest.raises(CheckpointError) as caught:
        load_backbone(BackboneSpec("vit_tiny_patch16_224.augreg_in21k", True, None, FAMILIES["dino_vit"].model_kwargs))
    message = str(caught.value)
    assert time.perf_counter() - started < 10 and "\n" not in message
    assert all(hint in message for hint in ("HF_HUB_OFFLINE=1", "checkpoint_path", "pretrained: false"))
    assert constants.HF_HUB_OFFLINE is False  # only the cache was read, for this load only


def test_a_flipped_bit_in_the_weights_or_the_record_is_refused(saved):
    from faults import flipped_copies

    reference = {k: v.clone() for k, v in load_pruned(saved)[0].state_dict().items()}
    for name in ("model.safetensors", "architecture.json"):
        for position in flipped_copies(saved / name, count=15):
            try:
                model, _ = load_pruned(saved)
            except CheckpointError:
                continue
            state = model.state_dict()  # only a harmless flip (JSON white space) may load, and then unchanged
            assert all(torch.equal(state[k], reference[k]) for k in reference), (name, position)


def test_a_downgraded_record_is_refused_not_read_without_its_checks(saved):
    """Version 1 skipped the record's checksum: no older version is a way around the checks."""
    record_path = saved / "architecture.json"
    record = json.loads(record_path.read_text())
    for version in (1, "2", True, None):
        edited = {k: v for k, v in record.items() if k not in ("sha256", "weights_sha256")}
        edited["version"] = version
        record_path.write_text(json.dumps(edited))
        with pytest.raises(CheckpointError, match="reads version 2 only .* re-export the checkpoint"):
            load_pruned(saved)
    record_path.write_text(json.dumps({**record, "version": 3}))
    with pytest.raises(CheckpointError, match="newer than this snapvit-pl reads"):
        load_pruned(saved)


@pytest.mark.parametrize("changes, field", [
    (dict(mlp_hidden=[-5, 64]), "mlp_hidden is [-5, 64]"),
    (dict(heads=["2", "3"]), "heads is ['2', '3']"),
    (dict(heads=3), "heads is 3"),
    (dict(heads=[10**13, 2]), "heads is [10000000000000, 2]"),
    (dict(heads=[2]), "mlp_hidden is"),
    (dict(kept_heads=[[0, 0], [1]]), "kept_heads"),
    (dict(weights_sha256=None), "weights_sha256 is None"),
    (dict(base="vit_tiny"), "the base model is 'vit_tiny'"),
    (dict(base={"model_name": "vit_tiny_patch16_224", "model_kwargs": {"act_layer": {"class_path": "timm.layers.os"}}}),
     "base.model_kwargs.act_layer"),
    (dict(base={"model_name": "vit_tiny_patch16_224", "model_kwargs": {"act_layer": {"class_path": "this.x"}}}),
     "a layer class of timm or torch.nn"),
    (dict(base={"model_name": "vit_tiny_patch16_224", "model_kwargs": {"depth": 100000}}), "base.model_kwargs.depth"),
    (dict(base={"model_name": "vit_tiny_patch16_224", "model_kwargs": {"embed_dim": -8}}),
     "base.model_kwargs.embed_dim"),
    (dict(base={"model_name": "vit_tiny_patch16_224", "pretrained": "yes"}), "base.pretrained is 'yes'"),
    (dict(base={"model_name": "vit_tiny_patch16_224", "weights": 1}), "base.weights"),
])
def test_an_edited_record_is_refused_naming_its_field(saved, changes, field):
    """Even with its checksum sealed again (someone who can edit the file), a record that breaks the schema is one
    error naming the file and the field, before timm builds anything (nothing is imported from a named module)."""
    _edit_record(saved, **changes)
    with pytest.raises(CheckpointError) as raised:
        load_pruned(saved)
    message = str(raised.value)
    assert str(saved / "architecture.json") in message and field in message and "\n" not in message


def test_a_record_nested_too_deeply_is_refused(saved):
    (saved / "architecture.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(CheckpointError, match="nested too deeply"):
        load_pruned(saved)
