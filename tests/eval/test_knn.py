import torch

from snapvit_pl.eval.knn import knn_classify


def clustered_features(num_classes=10, per_class=100, dim=32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(num_classes, dim, generator=generator) * 5
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    features = centers[labels] + 0.3 * torch.randn(labels.numel(), dim, generator=generator)
    return features, labels


def test_separable_features_are_classified_perfectly():
    train_x, train_y = clustered_features(seed=0)
    test_x, test_y = clustered_features(per_class=30, seed=0)
    result = knn_classify(train_x, train_y, test_x + 0.01, test_y, chunk_size=64)
    assert result == {"top1": 1.0, "top5": 1.0}


def test_shuffled_labels_give_chance_accuracy():
    train_x, train_y = clustered_features(per_class=200, seed=1)
    test_x, test_y = clustered_features(per_class=200, seed=1)
    generator = torch.Generator().manual_seed(2)
    train_y = train_y[torch.randperm(train_y.numel(), generator=generator)]
    test_y = test_y[torch.randperm(test_y.numel(), generator=generator)]
    result = knn_classify(train_x, train_y, test_x, test_y, num_classes=10)
    assert 0.05 < result["top1"] < 0.15
    assert 0.4 < result["top5"] < 0.6


def test_chunking_does_not_change_result_and_top5_needs_five_classes():
    train_x, train_y = clustered_features(num_classes=3, seed=3)
    test_x, test_y = clustered_features(num_classes=3, per_class=20, seed=4)
    noisy = test_x + 3 * torch.randn_like(test_x)
    full = knn_classify(train_x, train_y, noisy, test_y, chunk_size=10_000)
    chunked = knn_classify(train_x, train_y, noisy, test_y, chunk_size=7)
    assert full == chunked and set(full) == {"top1"}


def test_votes_are_weighted_by_similarity():
    # two close neighbours of class 1 outweigh three farther ones of class 0
    train_x = torch.tensor([[1.0, 0.0], [1.0, 0.05], [0.6, 0.8], [0.6, 0.8], [0.6, 0.8]])
    train_y = torch.tensor([1, 1, 0, 0, 0])
    result = knn_classify(train_x, train_y, torch.tensor([[1.0, 0.01]]), torch.tensor([1]), k=5)
    assert result["top1"] == 1.0
