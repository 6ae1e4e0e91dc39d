"""The whole command-line path on hub models (offline cache): prune.py with pretrained weights, then extract,
evaluate and deploy on what it wrote, for a timm name (SigLIP2, attention-pool head) and an hf-hub: name."""
import json
from pathlib import Path

import pytest

from hub_cache import HUB_NAMES, TIMM_NAMES
from snapvit_pl.cli import prune_main
from snapvit_pl.data import find_fashion_mnist
from snapvit_pl.elastic import ElasticScores
from snapvit_pl.cli.deploy import main as deploy_main
from snapvit_pl.cli.evaluate import main as evaluate_main
from snapvit_pl.cli.extract import main as extract_main
from snapvit_pl.models import load_pruned

pytestmark = [pytest.mark.slow, pytest.mark.skipif(find_fashion_mnist(None) is None, reason="dataset-fashion-mnist")]
TINY = ["--data.init_args.max_samples=32", "--data.init_args.batch_size=16", "--data.init_args.n_local_views=2",
        "--search.max_evaluations=4", "--search.popsize=4", "--search.num_images=32", "--search.batch_size=32",
        "--search.pca_components=8", "--export.budgets=[{sparsity: 0.4}]", "--export.split_candidates=3",
        "--evaluation.metrics=[knn]", "--evaluation.train_samples=60", "--evaluation.val_samples=30",
        "--evaluation.knn_k=5", "--report.print_table=false", "--trainer.enable_progress_bar=false"]


@pytest.mark.parametrize("name, kwargs", [
    ("vit_base_patch16_siglip_224.v2_webli", TIMM_NAMES["vit_base_patch16_siglip_224.v2_webli"]),
    ("hf-hub:snapvit-test/tiny-dino", {}),
], ids=["siglip2-timm-name", "hf-hub-name"])
def test_prune_extract_evaluate_deploy_from_the_hub(offline_hub, tmp_path, name, kwargs, capsys):
    run = tmp_path / "run"
    args = ["--out_dir", str(run), f"--model.model_name={name}", "--model.pretrained=true",
            "--model.checkpoint_path=null", f"--model.model_kwargs={json.dumps(kwargs)}", *TINY]
    assert prune_main(args) == 0, capsys.readouterr().err[-2000:]
    report = json.loads((run / "report.json").read_text())
    assert report["model"]["model_name"] == name and report["pruned"][0]["label"] == "sparsity0.4"

    scores = run / "elastic_scores.safetensors"
    assert ElasticScores.load(scores).base["model_name"] == name
    assert extract_main(["--scores", str(scores), "--export.budgets=[{flops: 0.5}]", "--out_dir", str(tmp_path / "cut")]) == 0
    model, record = load_pruned(tmp_path / "cut" / "flops0.5")
    if name.startswith("hf-hub:"):  # the record names the resolved timm architecture: no hub needed to rebuild
        assert record["base"]["model_name"] == HUB_NAMES[name][0]

    capsys.readouterr()
    assert evaluate_main(["--checkpoint", str(tmp_path / "cut" / "flops0.5"), "--evaluation.metrics=[knn]",
                          "--evaluation.train_samples=60", "--evaluation.val_samples=30", "--evaluation.knn_k=5"]) == 0
    assert 0 <= json.loads(capsys.readouterr().out)["knn_top1"] <= 1
    pytest.importorskip("onnx")
    assert deploy_main(["--checkpoint", str(tmp_path / "cut" / "flops0.5"), "--out", str(tmp_path / "m.onnx"),
                        "--check", "true"]) == 0
    assert Path(tmp_path / "m.onnx").stat().st_size > 0
