import pytest
from safetensors.torch import save_file

from families import FAMILIES, random_elastic_scores
from snapvit_pl.cli.extract import main
from snapvit_pl.elastic import SplitTable
from snapvit_pl.models import BackboneSpec, count_flops, load_backbone, load_pruned


@pytest.fixture
def scores_file(tmp_path):
    spec = FAMILIES["dino_vit"]
    model = load_backbone(BackboneSpec(spec.model_name, False, None, spec.model_kwargs, seed=7))  # not seed 0's
    save_file(model.state_dict(), str(tmp_path / "base.safetensors"))
    scores = random_elastic_scores(model)
    scores.base = BackboneSpec(spec.model_name, False, str(tmp_path / "base.safetensors"), spec.model_kwargs).to_dict()
    scores.settings = {"export": {"mlp_multiple": 4}}
    scores.splits = SplitTable({"flops": [(0.4, 0.5), (0.6, 0.25)]})
    return scores.save(tmp_path / "scores.safetensors"), model


def test_extracts_every_budget_with_the_runs_rounding_and_splits(scores_file, tmp_path, capsys):
    path, dense = scores_file
    code = main(["--scores", str(path), "--out_dir", str(tmp_path / "out"), "--progress=off",
                 "--export.budgets=[{flops: 0.5}, {mlp_ratio: 0.35, head_ratio: 0.25}]"])
    assert code == 0, capsys.readouterr().err
    half, record = load_pruned(tmp_path / "out" / "flops0.5")
    assert count_flops(half) <= 0.5 * count_flops(dense) and record["extra"]["budget"] == {"flops": 0.5}
    # asked of the ranking: halfway between the recorded 0.4 and 0.6 splits; recorded: the share the saved model lost
    assert record["extra"]["requested_head_ratio"] == pytest.approx(0.375)
    dense_heads = sum(block.attn.num_heads for block in dense.blocks)
    assert record["extra"]["head_ratio"] == pytest.approx(1 - sum(record["heads"]) / dense_heads)
    assert all(width % 4 == 0 for width in record["mlp_hidden"])  # the run's mlp_multiple
    assert load_pruned(tmp_path / "out" / "mlp0.35_head0.25")[1]["extra"]["head_ratio"] == 0.25
    assert "flops0.5" in capsys.readouterr().out


def test_other_base_weights_are_refused(scores_file, tmp_path, capsys):
    path, _ = scores_file
    other = load_backbone(FAMILIES["dino_vit"])  # same architecture, different random weights (seed 0, not 7)
    save_file(other.state_dict(), str(tmp_path / "other.safetensors"))
    code = main(["--scores", str(path), "--export.budgets=[{flops: 0.5}]", "--out_dir", str(tmp_path / "out"),
                 "--model.checkpoint_path", str(tmp_path / "other.safetensors")])
    assert code == 2 and "computed for other weights" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()



def test_a_null_given_for_a_recorded_field_is_honoured(scores_file, tmp_path, capsys):
    """--model.checkpoint_path null: no weights file (random weights of the recorded seed), not the recorded file;
    here those are other weights than the scores', so the cut is refused."""
    path, _ = scores_file
    code = main(["--scores", str(path), "--export.budgets=[{flops: 0.5}]", "--out_dir", str(tmp_path / "out"),
                 "--model.checkpoint_path", "null"])
    assert code == 2 and "computed for other weights" in capsys.readouterr().err
    assert main(["--scores", str(path), "--export.budgets=[{flops: 0.5}]", "--out_dir", str(tmp_path / "out")]) == 0


@pytest.mark.parametrize("budgets, message", [
    ("[{flop: 0.5}]", "unknown budget key 'flop' (did you mean 'flops'?)"),
    ("[{sparsity:0.3}]", "YAML needs a space after the colon"),
    ("[{flops: abc}]", "is not a number"),
    ("[{mlp_ratio: 1.2, head_ratio: 0.1}]", "mlp_ratio=1.2 is outside [0, 1)"),
])
def test_bad_budgets_are_one_line(scores_file, tmp_path, capsys, budgets, message):
    path, _ = scores_file
    assert main(["--scores", str(path), f"--export.budgets={budgets}", "--out_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
