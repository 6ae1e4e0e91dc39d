import json
import subprocess
import sys

import pytest
import torch

from families import FAMILIES, random_elastic_scores as _elastic
from snapvit_pl.elastic import Budget, ElasticScores, ElasticViT, initial_coefficients, split_coefficients
from snapvit_pl.errors import CheckpointError
from snapvit_pl.models import BackboneSpec, architecture, fingerprint, load_backbone


def test_coefficient_layout_round_trips():
    init = initial_coefficients(3, [4, 4, 4], 1.2, 0.8)
    assert init.shape == (15,) and init[0] == pytest.approx(1.2) and init[2] == pytest.approx(0.8)
    mlp, heads = split_coefficients(init, [4, 4, 4])
    assert torch.equal(mlp, torch.tensor([1.2, 1.0, 0.8])) and torch.equal(heads[2], torch.full((4,), 0.8))


def test_unified_scores_multiply_by_absolute_coefficients():
    scores = ElasticScores([torch.ones(2)], [torch.tensor([1.0, 2.0])], torch.tensor([-3.0, 0.5, -2.0]))
    heads, neurons = scores.unified()
    assert heads[0].tolist() == [0.5, 2.0] and neurons[0].tolist() == [3.0, 6.0]


def test_save_load_round_trip_and_fingerprint(tmp_path):
    model = load_backbone(FAMILIES["dino_vit"])
    scores = _elastic(model)
    scores.settings = {"scorer": "ssl_fisher"}
    scores.save(tmp_path / "scores.safetensors")
    loaded = ElasticScores.load(tmp_path / "scores.safetensors")
    assert loaded.settings == {"scorer": "ssl_fisher"} and loaded.fingerprint == fingerprint(model)
    assert all(torch.equal(a, b) for a, b in zip(loaded.neuron_scores, scores.neuron_scores))
    loaded.check_model(model)
    with pytest.raises(CheckpointError, match="computed for other weights"):
        loaded.check_model(load_backbone(BackboneSpec(FAMILIES["dino_vit"].model_name, False, None,
                                                      FAMILIES["dino_vit"].model_kwargs, seed=1)))  # other weights
    with pytest.raises(CheckpointError, match="but the model has heads"):
        loaded.check_model(load_backbone(BackboneSpec("vit_small_patch16_224", False, None, dict(FAMILIES["dino_vit"].model_kwargs, num_heads=2))))


def test_corrupt_and_foreign_files(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        ElasticScores.load(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="not a readable elastic-scores file"):
        ElasticScores.load(tmp_path / "junk.safetensors")
    model = load_backbone(FAMILIES["dino_vit"])
    path = _elastic(model).save(tmp_path / "ok.safetensors")
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(CheckpointError):
        ElasticScores.load(path)


def test_elastic_vit_switches_budgets_without_reloading():
    model = load_backbone(FAMILIES["eva02_separate_qkv"])
    elastic = ElasticViT(model, _elastic(model))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        dense = elastic(x)
        assert torch.equal(dense, model(x))
        elastic.set_budget(flops=0.5)
        assert elastic.flops <= 0.5 * elastic.cost.dense_flops
        half = elastic(x)
        assert (half - elastic.extract()(x)).abs().max() <= 1e-5
        elastic.set_budget(mlp_ratio=0.15, head_ratio=0.0)
        assert architecture(elastic.extract())["heads"] == [4, 4]
        assert not torch.equal(half, elastic(x))


_EXTRACT = """
import sys, json, torch
sys.path.insert(0, {models!r})
from families import FAMILIES, random_elastic_scores as _elastic
from snapvit_pl.elastic import ElasticScores, ElasticViT, Budget
torch.manual_seed(0)
from snapvit_pl.models import load_backbone
model = load_backbone(FAMILIES["dino_vit"])
elastic = ElasticViT(model, ElasticScores.load({path!r}))
out = {{}}
for label, budget in [("pair", Budget(mlp_ratio=0.35, head_ratio=0.2)), ("flops", Budget(flops=0.6))]:
    elastic.set_budget(budget)
    out[label] = {{"heads": [h.tolist() for h in elastic.subnet.heads], "neurons": [n.tolist() for n in elastic.subnet.neurons]}}
print(json.dumps(out))
"""


def test_artifact_reloaded_in_fresh_process_extracts_identical_models(tmp_path):
    torch.manual_seed(0)
    model = load_backbone(FAMILIES["dino_vit"])
    scores = _elastic(model)
    path = scores.save(tmp_path / "scores.safetensors")
    elastic = ElasticViT(model, scores)
    expected = {}
    for label, budget in [("pair", Budget(mlp_ratio=0.35, head_ratio=0.2)), ("flops", Budget(flops=0.6))]:
        elastic.set_budget(budget)
        expected[label] = {"heads": [h.tolist() for h in elastic.subnet.heads], "neurons": [n.tolist() for n in elastic.subnet.neurons]}
    models_dir = str(__import__("pathlib").Path(__file__).parents[1] / "models")
    script = _EXTRACT.format(models=models_dir, path=str(path))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == expected


def test_a_damaged_scores_file_is_refused_or_reads_the_same(tmp_path):
    """Every single flipped bit: refused on read (the checksum of tensors and header, or the format), or harmless
    (white space of the header): never different scores."""
    from faults import flipped_copies

    path = tmp_path / "scores.safetensors"
    _elastic(load_backbone(FAMILIES["dino_vit"])).save(path)
    expected = ElasticScores.load(path)
    refused = 0
    for position in flipped_copies(path, count=60):
        try:
            loaded = ElasticScores.load(path)
        except CheckpointError:
            refused += 1
            continue
        assert loaded.base == expected.base and all(torch.equal(a, b) for a, b in zip(
            loaded.neuron_scores + loaded.head_scores, expected.neuron_scores + expected.head_scores)), position
    assert refused >= 50
    tensors_start = path.stat().st_size - sum(t.numel() * 4 for t in expected.neuron_scores + expected.head_scores)
    data = bytearray(path.read_bytes())
    for i in range(tensors_start, len(data), max(1, (len(data) - tensors_start) // 1000)):
        data[i] ^= 0xFF  # the case: many bytes of the payload
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        ElasticScores.load(path)


def test_the_scores_file_has_one_metadata_entry(tmp_path):
    """safetensors writes several metadata entries in a random order (a Rust HashMap): with more than one, the same
    scores would not give the same bytes from run to run."""
    from safetensors import safe_open

    _elastic(load_backbone(FAMILIES["dino_vit"])).save(tmp_path / "scores.safetensors")
    with safe_open(str(tmp_path / "scores.safetensors"), framework="pt") as f:
        assert list(f.metadata()) == ["snapvit"]


def test_a_scores_file_without_its_checksum_is_refused(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = tmp_path / "scores.safetensors"
    _elastic(load_backbone(FAMILIES["dino_vit"])).save(path)
    with safe_open(str(path), framework="pt") as f:
        header, tensors = json.loads(f.metadata()["snapvit"]), {k: f.get_tensor(k) for k in f.keys()}
    del header["sha256"]
    save_file(tensors, str(path), metadata={"snapvit": json.dumps(header)})
    with pytest.raises(CheckpointError, match="carries no checksum"):
        ElasticScores.load(path)


def _rewrite(path, edit_header=None, edit_tensors=None, seal=True):
    """Rewrite a scores file's header / tensors, sealing it again with its checksum (someone who can edit it)."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    from snapvit_pl.io import CHECKSUM_KEY, content_digest

    with safe_open(str(path), framework="pt") as f:
        header, tensors = json.loads(f.metadata()["snapvit"]), {k: f.get_tensor(k) for k in f.keys()}
    header.pop(CHECKSUM_KEY)
    (edit_header or (lambda h: None))(header)
    (edit_tensors or (lambda t: None))(tensors)
    if seal:
        header[CHECKSUM_KEY] = content_digest({"header": header, "tensors": tensors})
    save_file(tensors, str(path), metadata={"snapvit": json.dumps(header)})


@pytest.fixture
def scores_path(tmp_path):
    path = tmp_path / "scores.safetensors"
    scores = _elastic(load_backbone(FAMILIES["dino_vit"]))
    scores.base = FAMILIES["dino_vit"].to_dict()
    return scores.save(path)


def test_a_downgraded_scores_file_is_refused(scores_path):
    """Negated scores marked version 1 without a checksum once cut other models with exit 0."""
    def downgrade(header):
        header["version"] = 1

    _rewrite(scores_path, downgrade, lambda t: t.update({k: -v for k, v in t.items()}), seal=False)
    with pytest.raises(CheckpointError, match="format version 1; this snapvit-pl reads version 3 only"):
        ElasticScores.load(scores_path)


@pytest.mark.parametrize("edit_header, edit_tensors, field", [
    (lambda h: h.pop("num_blocks"), None, "num_blocks is None"),
    (lambda h: h.update(base="vit"), None, "base is 'vit'"),
    (lambda h: h.update(splits={"flops": [[0.5]]}), None, "splits.flops"),
    (lambda h: h.update(splits={"latency": [[0.5, 0.2]]}), None, "splits.latency"),
    (lambda h: h.update(version="3"), None, "format version '3'"),
    (lambda h: h.update(min_mlp_keep=2.0), None, "min_mlp_keep is 2.0"),
    (None, lambda t: t.update({"heads.0": t["heads.0"].reshape(1, -1)}), "tensor heads.0"),
    (None, lambda t: t.update({"neurons.1": torch.full_like(t["neurons.1"], float("nan"))}), "tensor neurons.1"),
    (None, lambda t: t.pop("neurons.1"), "tensors is ['neurons.1']"),
])
def test_an_edited_scores_file_is_refused_naming_its_field(scores_path, edit_header, edit_tensors, field):
    _rewrite(scores_path, edit_header, edit_tensors)
    with pytest.raises(CheckpointError) as raised:
        ElasticScores.load(scores_path)
    assert str(scores_path) in str(raised.value) and field in str(raised.value)
