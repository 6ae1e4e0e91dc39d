"""The held-out images and the output check that keep a correction from making a model worse (issue 75)."""
import copy

import torch
from calibration import half_subnet, model_of, smooth_images
from timm.models.vision_transformer import VisionTransformer

from snapvit_pl.correction import OutputCheck, OutputGuard, split_calibration
from snapvit_pl.correction.guard import is_headless, neighbour_sets
from snapvit_pl.models import prune_


def test_the_last_share_is_held_out_before_anything_is_fitted():
    images = torch.arange(10).float().view(10, 1, 1, 1)
    fit, held = split_calibration(images, 0.2)
    assert fit.flatten().tolist() == list(range(8)) and held.flatten().tolist() == [8, 9]
    assert [len(part) for part in split_calibration(images, 0.01)] == [9, 1]  # at least one image
    assert [len(part) for part in split_calibration(images, 0.0)] == [10, 0]  # none asked
    assert [len(part) for part in split_calibration(images[:1], 0.5)] == [1, 0]  # the fit needs one
    assert [len(part) for part in split_calibration(images[:2], 0.99)] == [1, 1]


def test_neighbourhoods_are_the_nearest_other_rows():
    features = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    assert neighbour_sets(features, 1).flatten().tolist() == [1, 0, 3, 2]


def test_the_dense_model_is_closest_to_itself_and_a_cut_model_drifts():
    model, held = model_of("dino_vit"), smooth_images(16, 2)
    guard = OutputGuard(model, held, batch_size=8)
    assert guard.dense_neighbours is not None and guard.k == 10  # dino_vit has no classifier: neighbourhoods too
    same = guard.check(copy.deepcopy(model))
    assert same.drift < 1e-6 and same.neighbours == 1.0
    cut = guard.check(prune_(copy.deepcopy(model), half_subnet(model)))
    assert cut.drift > same.drift and same.at_least_as_good_as(cut) and not cut.at_least_as_good_as(same)


def test_the_corrected_model_is_kept_only_when_it_is_at_least_as_close_on_every_measure():
    model, held = model_of("dino_vit"), smooth_images(16, 2)
    guard = OutputGuard(model, held, batch_size=8)
    cut = prune_(copy.deepcopy(model), half_subnet(model))
    keep, record = guard.choose(cut, copy.deepcopy(model))  # a "correction" that gives the dense outputs back
    assert keep and record["kept"] == "corrected" and record["held_out_images"] == 16
    keep, record = guard.choose(copy.deepcopy(model), cut)  # one that drifts more than the model "as cut"
    assert not keep and record["kept"] == "as cut"
    keep, _ = guard.choose(cut, copy.deepcopy(cut))  # no change: the model as cut
    assert not keep
    # closer in drift but fewer neighbours kept: refused for a headless model, taken for one with a classifier
    better_drift_fewer_neighbours = OutputCheck(0.01, 0.5)
    assert not better_drift_fewer_neighbours.at_least_as_good_as(OutputCheck(0.02, 0.6))
    assert OutputCheck(0.01).at_least_as_good_as(OutputCheck(0.02))


def test_a_model_with_a_classifier_is_checked_on_its_embedding_only():
    headed = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5).eval()
    assert not is_headless(headed)
    guard = OutputGuard(headed, smooth_images(12, 3), batch_size=4)
    assert guard.dense_neighbours is None and guard.check(headed).neighbours is None
