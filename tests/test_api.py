"""The Python API (snapvit_pl.fit_elastic) runs the prune.py pipeline: the same scores, bit for bit."""
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import snapvit_pl
from families import FAMILIES
from snapvit_pl.cli import prune_main
from snapvit_pl.pipeline import ExportSettings, ImportanceSettings, scoring_views
from snapvit_pl.data import ClassificationDataModule, find_fashion_mnist
from snapvit_pl.elastic import ElasticScores
from snapvit_pl.errors import ConfigError
from snapvit_pl.models import BackboneSpec, count_flops, fingerprint, load_backbone
from snapvit_pl.scoring import LabelFisher, Magnitude

ROOT = Path(__file__).resolve().parents[1]
needs_data = pytest.mark.skipif(find_fashion_mnist(None) is None, reason="apt-get install dataset-fashion-mnist")


@needs_data
def test_fit_elastic_gives_the_scores_of_prune_py(tiny_prune_args, tmp_path):
    args = tiny_prune_args + ["--evaluation.metrics=[]", "--export.save_models=false"]
    assert prune_main(args) == 0
    cli_scores = ElasticScores.load(tmp_path / "run" / "elastic_scores.safetensors")

    pl.seed_everything(0)  # as prune.py does before it builds the (random-weight) model
    spec = BackboneSpec.from_dict(cli_scores.base)
    model = load_backbone(spec)
    dm = ClassificationDataModule(source="fashion_mnist", max_samples=48, batch_size=16, n_local_views=2, seed=0)
    dm.configure_for_model(model)
    dm.train_views = scoring_views(ImportanceSettings().scorer)  # the default scorer's views, as prune.py picks them
    search = snapvit_pl.SearchSettings(max_evaluations=4, num_images=32, batch_size=32, pca_components=8)
    export = ExportSettings(budgets=[{"mlp_ratio": 0.35, "head_ratio": 0.25}, {"flops": 0.6}])
    scores = snapvit_pl.fit_elastic(model, dm.train_dataloader(), search=search, export=export, spec=spec,
                                    fitness_images=dm.unlabeled_images(32, 32), progress=False)
    for a, b in zip(scores.head_scores + scores.neuron_scores, cli_scores.head_scores + cli_scores.neuron_scores):
        assert torch.equal(a, b)
    assert torch.equal(scores.coefficients, cli_scores.coefficients)
    assert scores.search["best_fitness"] == cli_scores.search["best_fitness"]
    assert scores.settings == cli_scores.settings and scores.fingerprint == cli_scores.fingerprint
    assert scores.splits == cli_scores.splits and len(scores.splits) > 2  # the budget asked for and the grid


def _plain_loader(n=24, batch_size=8, labels=False):
    images = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    tensors = (images, torch.randint(0, 10, (n,))) if labels else (images,)
    return DataLoader(TensorDataset(*tensors), batch_size=batch_size)


def test_plain_images_then_extract_at_a_budget():
    model = load_backbone(FAMILIES["augreg_vit"])
    before = fingerprint(model)
    search = snapvit_pl.SearchSettings(max_evaluations=4, popsize=4, num_images=16, batch_size=8, pca_components=8)
    scores = snapvit_pl.fit_elastic(model, (batch[0] for batch in _plain_loader()), search=search, progress=False)
    assert scores.search["evaluations"] == 4 and scores.coefficients is not None and scores.base == {}
    small = scores.extract(model, flops=0.5)
    assert count_flops(small) <= 0.5 * count_flops(model)
    assert fingerprint(model) == before, "the base model is left intact"
    again = snapvit_pl.fit_elastic(model, (batch[0] for batch in _plain_loader(batch_size=5)), search=search, progress=False)
    for a, b in zip(scores.neuron_scores, again.neuron_scores):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7 * float(a.abs().max()))  # crops do not depend on batching


def test_data_free_and_label_scorers():
    model = load_backbone(FAMILIES["augreg_vit"])
    search = snapvit_pl.SearchSettings(max_evaluations=0)
    with pytest.raises(ConfigError, match="split='schedule'"):  # no images for the split choice
        snapvit_pl.fit_elastic(model, [], scorer=Magnitude(), search=search, progress=False)
    scores = snapvit_pl.fit_elastic(model, [], scorer=Magnitude(), search=search, export=ExportSettings(split="schedule"),
                                    progress=False)
    assert scores.settings["scorer"]["name"] == "magnitude"
    labeled = snapvit_pl.fit_elastic(model, _plain_loader(labels=True), scorer=LabelFisher(), search=search, progress=False)
    assert labeled.settings["scorer"]["name"] == "label_fisher"
    with pytest.raises(ConfigError, match="needs labels"):
        snapvit_pl.fit_elastic(model, (b[0] for b in _plain_loader()), scorer=LabelFisher(), search=search, progress=False)


def test_multicrop_loader_needs_fitness_images():
    model = load_backbone(FAMILIES["augreg_vit"])
    views = [torch.randn(4, 3, 3, 32, 32)]
    with pytest.raises(ConfigError, match="fitness_images"):
        snapvit_pl.fit_elastic(model, views, search=snapvit_pl.SearchSettings(max_evaluations=2), progress=False)


def test_budgets_given_to_fit_elastic_get_their_split_recorded():
    model = load_backbone(FAMILIES["augreg_vit"])
    search = snapvit_pl.SearchSettings(max_evaluations=4, popsize=4, num_images=16, batch_size=8, pca_components=8)
    export = ExportSettings(budgets=[{"sparsity": 0.4}], split_candidates=3, split_grid=0)
    scores = snapvit_pl.fit_elastic(model, (batch[0] for batch in _plain_loader()), search=search, export=export,
                                    progress=False)
    assert scores.splits.points["params"] == [(0.6, scores.splits.head_ratio("params", 0.6))]
    small = scores.extract(model, sparsity=0.4)
    from snapvit_pl.models import count_params

    assert count_params(small) <= 0.6 * count_params(model)
    assert count_params(scores.extract(model, sparsity=0)) == count_params(model)  # the split of 0.4 removes nothing
