"""The pruning data set-up: each scorer gets the views it needs, and a self-distillation scorer the data's global crops."""

import pytest
import torch

from families import FAMILIES
from snapvit_pl.scoring.base import ScoringContext
from snapvit_pl.data import ClassificationDataModule
from snapvit_pl.errors import ConfigError
from snapvit_pl.models import load_backbone
from snapvit_pl.pipeline import local_importance, prepare_pruning_data
from snapvit_pl.scoring import LabelFisher, Magnitude, OutputSensitivity, SSLFisher, SSLMaskFisher, Taylor


def _data(tmp_path, **kwargs):
    """A real DataModule (its options, its multi-crop settings) over 8 stand-in images."""
    dm = ClassificationDataModule("folder", str(tmp_path), batch_size=2, **kwargs)
    dm.configure_for_model = lambda model: None
    dm.dataset = lambda split, max_samples=None: list(range(8))
    return dm


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return load_backbone(FAMILIES["dino_vit"])


@pytest.mark.parametrize("cls", [SSLFisher, Taylor, SSLMaskFisher])
def test_a_self_distillation_scorer_takes_the_global_crops_the_data_makes(tmp_path, model, cls):
    dm = _data(tmp_path, n_global_views=1, n_local_views=3)
    scorer = cls()
    handed = prepare_pruning_data(dm, model, scorer)
    assert dm.train_views == "multicrop" and handed == {"global_views": 1, "batch_size": dm.batch_size}
    context = ScoringContext(**handed)
    assert scorer.bind(model, context).global_views == 1
    batch = torch.randn(2, 4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    got = local_importance(scorer, model, [batch], context)
    one = local_importance(cls(n_global=1), model, [batch])
    two = local_importance(cls(n_global=2), model, [batch])  # what the scorer assumed whatever the data made
    assert torch.equal(got.neurons[0], one.neurons[0]) and not torch.equal(got.neurons[0], two.neurons[0])


def test_a_scorer_n_global_that_differs_from_the_data_is_refused(tmp_path, model):
    with pytest.raises(ConfigError, match=r"importance.scorer.init_args.n_global 2 differs from "
                                          r"data.init_args.n_global_views 1"):
        prepare_pruning_data(_data(tmp_path, n_global_views=1), model, SSLFisher(n_global=2))
    scorer = SSLFisher(n_global=3)
    assert prepare_pruning_data(_data(tmp_path, n_global_views=3), model, scorer)["global_views"] == 3  # the same


def test_multicrop_views_a_teacher_cannot_use_are_refused(tmp_path, model):
    with pytest.raises(ConfigError, match="needs data.init_args.n_global_views >= 1"):
        prepare_pruning_data(_data(tmp_path, n_global_views=0), model, SSLFisher())
    with pytest.raises(ConfigError, match="at least 2 views in all"):
        prepare_pruning_data(_data(tmp_path, n_global_views=1, n_local_views=0), model, Taylor())


@pytest.mark.parametrize("scorer, train_views, needed", [
    (OutputSensitivity(), "multicrop", "plain"), (SSLFisher(), "plain", "multicrop"), (Magnitude(), "multicrop", "plain"),
    (LabelFisher(), "plain", "labeled"),
], ids=["sensitivity", "ssl_fisher", "magnitude", "label_fisher"])
def test_train_views_other_than_the_scorers_are_refused(tmp_path, model, scorer, train_views, needed):
    dm = _data(tmp_path, train_views=train_views)
    with pytest.raises(ConfigError, match=rf"data.init_args.train_views {train_views} has no effect in a pruning run: "
                                          rf"it feeds each scorer the views it needs, and the {scorer.name} scorer "
                                          rf"needs {needed} "):
        prepare_pruning_data(dm, model, scorer)
    assert dm.train_views == train_views


@pytest.mark.parametrize("scorer, train_views", [(OutputSensitivity(), "labeled"), (OutputSensitivity(), "plain"),
                                                 (SSLFisher(), "multicrop"), (LabelFisher(), "labeled")],
                         ids=["default", "plain", "multicrop", "labeled"])
def test_train_views_left_at_the_default_or_those_the_scorer_needs_are_accepted(tmp_path, model, scorer, train_views):
    dm = _data(tmp_path, train_views=train_views)
    prepare_pruning_data(dm, model, scorer)
    prepare_pruning_data(dm, model, scorer)  # twice (a second set-up, another DDP hook): the same views
    assert dm.train_views == ("labeled" if isinstance(scorer, LabelFisher) else
                              "multicrop" if isinstance(scorer, SSLFisher) else "plain")


@pytest.fixture
def broken():
    """A user's scorer (docs/python.md, "Your own scorer") whose scores go wrong in one of three ways (registered
    as it is defined, so removed from the registry after the test)."""
    from snapvit_pl.scoring import SCORERS

    class Broken(Magnitude):
        name = "broken"

        def __init__(self, how: str = "nan"):
            super().__init__()
            self.how = how

        def compute(self):
            scores = super().compute()
            if self.how == "nan":
                scores.heads[1][2] = float("nan")
            elif self.how == "inf":
                scores.heads = [torch.full_like(h, float("inf")) for h in scores.heads]
            else:
                scores.neurons[0] = scores.neurons[0][:-1]
            return scores

    yield Broken
    SCORERS.pop("broken", None)


@pytest.mark.parametrize("how, message", [
    ("nan", r"the broken scorer computed a non-finite score \(nan\) for block 1's head 2: a scorer returns one finite"),
    ("inf", r"a non-finite score \(inf\) for block 0's head 0 \(and \d+ more\)"),
    ("short", r"the broken scorer computed \d+ scores for block 0's \d+ MLP neurons: a scorer returns one finite"),
])
def test_scores_a_scorer_gets_wrong_are_refused_naming_the_scorer_unit_and_index(model, broken, how, message):
    """Issue 77: a custom scorer's NaN was accepted (a model cut, exit 0); all-inf scores were refused as 'every unit
    would be removed'; a short vector as scores 'for ? with heads [4, 4], but the model has heads [4, 4]'."""
    import snapvit_pl
    from snapvit_pl.scoring.base import ScoringError

    with pytest.raises(ScoringError, match=message):
        local_importance(broken(how), model, [])
    images = torch.randn(4, *model.pretrained_cfg["input_size"]) if hasattr(model, "pretrained_cfg") else None
    with pytest.raises(ScoringError, match=message):
        snapvit_pl.fit_elastic(model, [images], scorer=broken(how), progress=False)
