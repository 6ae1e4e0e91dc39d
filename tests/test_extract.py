import pytest
from safetensors.torch import save_file

from families import FAMILIES, random_elastic_scores
from snapvit_pl.extract import main, parse_budget
from snapvit_pl.errors import ConfigError
from snapvit_pl.models import BackboneSpec, count_flops, load_backbone, load_pruned


@pytest.fixture
def scores_file(tmp_path):
    spec = FAMILIES["dino_vit"]
    model = load_backbone(spec)
    save_file(model.state_dict(), str(tmp_path / "base.safetensors"))
    scores = random_elastic_scores(model)
    scores.base = BackboneSpec(spec.model_name, False, str(tmp_path / "base.safetensors"), spec.model_kwargs).to_dict()
    return scores.save(tmp_path / "scores.safetensors"), model


def test_extracts_every_budget(scores_file, tmp_path, capsys):
    path, dense = scores_file
    assert main(["--scores", str(path), "--budget", "flops=0.5", "--budget", "mlp_ratio=0.35,head_ratio=0.25", "--out", str(tmp_path / "out")]) == 0
    half, record = load_pruned(tmp_path / "out" / "flops0.5")
    assert count_flops(half) <= 0.5 * count_flops(dense) and record["extra"]["budget"] == {"flops": 0.5}
    assert load_pruned(tmp_path / "out" / "mlp0.35_head0.25")[1]["extra"]["head_ratio"] == 0.25
    assert "flops0.5" in capsys.readouterr().out


def test_other_base_weights_are_refused(scores_file, tmp_path, capsys):
    path, _ = scores_file
    other = load_backbone(FAMILIES["dino_vit"])  # same architecture, different random weights
    save_file(other.state_dict(), str(tmp_path / "other.safetensors"))
    code = main(["--scores", str(path), "--budget", "flops=0.5", "--out", str(tmp_path / "out"), "--checkpoint-path", str(tmp_path / "other.safetensors")])
    assert code == 2 and "computed for other weights" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["flops", "flops=abc", "speed=2", "mlp_ratio=1.2"])
def test_bad_budget_text(text):
    with pytest.raises(ConfigError if text != "mlp_ratio=1.2" else Exception):
        parse_budget(text)
