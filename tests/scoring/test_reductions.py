import io

import pytest
import torch

from scoring_helpers import build, full_backward_grads, labels, scores_of, views
from snapvit_pl.errors import CheckpointError
from snapvit_pl.scoring import LabelFisher, SNIPMagnitude, SSLFisher, ScoringError

CASES = {
    "ssl_fisher": (lambda **kw: SSLFisher(**kw), None),
    "label_fisher": (lambda **kw: LabelFisher(**kw), 5),
}




def assert_same(a, b, rtol=1e-5):
    for x, y in zip(a.heads + a.neurons, b.heads + b.neurons):
        torch.testing.assert_close(x, y, rtol=rtol, atol=0)


def split(x, y, sizes):
    return list(zip(x.split(sizes), y.split(sizes)))


@pytest.mark.parametrize("family", ["dino_vit", "dinov2_swiglu_packed"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_squared_sum_does_not_depend_on_batching(case, family):
    """Exact in float64 (per-sample separable losses); the 1e-5 tolerance is generous there."""
    make, num_classes = CASES[case]
    model, x, y = build(family, num_classes).double(), views(8).double(), labels(8)
    one = scores_of(make(), model, split(x, y, [8]))
    assert_same(one, scores_of(make(), model, split(x, y, [4, 4])))
    assert_same(one, scores_of(make(), model, split(x, y, [5, 3])))  # uneven batches too


def test_squared_sum_batching_in_float32():
    """In float32 the batch-size-dependent summation order leaves ~1e-7 noise on each gradient entry;
    units whose gradient nearly cancels across samples can see a little more after squaring."""
    model, x = build("dino_vit"), views(8)
    assert_same(scores_of(SSLFisher(), model, [x]), scores_of(SSLFisher(), model, list(x.split(4))), rtol=1e-4)


def test_fisher_reduction_depends_on_batching():
    """Documented: the paper's per-batch formula changes with the batch composition."""
    model, x = build("dino_vit"), views(8)
    one = scores_of(SSLFisher(reduction="fisher"), model, [x])
    two = scores_of(SSLFisher(reduction="fisher"), model, list(x.split(4)))
    assert not torch.allclose(one.neurons[0], two.neurons[0], rtol=1e-3)


def fake_ddp(scorers, batches_per_rank):
    """Feed each 'rank' its batches, then reduce with an all-reduce that sums across them."""
    scorers = [scorer.bind(model) for scorer, (model, _) in zip(scorers, batches_per_rank)]
    for scorer, (_, batches) in zip(scorers, batches_per_rank):
        for batch in batches:
            scorer.update(batch)
    calls = [[] for _ in scorers]
    for rank, scorer in enumerate(scorers[1:], start=1):  # record the other ranks' tensors, in call order
        scorer.reduce(lambda t, r=rank: calls[r].append(t.clone()) or t)
    scorers[0].reduce(lambda t: t + sum(c.pop(0) for c in calls[1:]))
    return scorers[0].compute()


@pytest.mark.parametrize(
    "make, num_classes",
    [(lambda: SSLFisher(), None), (lambda: SSLFisher(reduction="fisher"), None),
     (lambda: LabelFisher(reduction="fisher"), 5), (lambda: SNIPMagnitude(), None)],
    ids=["ssl_squared_sum", "ssl_fisher", "label_fisher", "snip_magnitude"],
)
def test_reduce_equals_one_scorer_fed_all_batches(make, num_classes):
    model, x, y = build("vit_swiglu", num_classes), views(8), labels(8)
    batches = split(x, y, [4, 2, 2])
    single = scores_of(make(), model, batches)
    reduced = fake_ddp([make(), make()], [(model, batches[:1]), (model, batches[1:])])
    assert_same(single, reduced)


def test_two_process_squared_sum_equals_one_process_with_other_batches():
    """DDP shards differently than one process batches; squared_sum does not care."""
    model, x = build("eva02_separate_qkv"), views(8)
    single = scores_of(SSLFisher(), model, [x])
    rank0, rank1 = x[0::2], x[1::2]  # DistributedSampler-style interleaved shards
    assert_same(single, fake_ddp([SSLFisher(), SSLFisher()], [(model, list(rank0.split(2))), (model, [rank1])]))


@pytest.mark.parametrize("make", [lambda: SSLFisher(), lambda: SSLFisher(reduction="fisher"), lambda: SNIPMagnitude()],
                         ids=["squared_sum", "fisher", "snip"])
def test_resume_mid_way_gives_identical_scores(make):
    model, x = build("dinov2_swiglu_packed"), views(6)
    batches = list(x.split(2))
    expected = scores_of(make(), model, batches)

    first = make().bind(model)
    first.update(batches[0])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    state = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)

    spec = make()
    with pytest.raises(ScoringError, match="a specification holds no statistics"):
        spec.load_state_dict(state)
    assert not hasattr(spec, "_acc") and spec.state_dict()["batches"] == 0
    resumed = spec.bind(model)
    resumed.load_state_dict(state)
    for batch in batches[1:]:
        resumed.update(batch)
    got = resumed.compute()
    assert all(torch.equal(a, b) for a, b in zip(got.heads + got.neurons, expected.heads + expected.neurons))


def test_resume_refuses_another_configuration_or_model():
    scorer = SSLFisher().bind(build("dino_vit"))
    state = scorer.state_dict()
    with pytest.raises(CheckpointError, match="cannot resume ssl_fisher \\(reduction fisher\\)"):
        SSLFisher(reduction="fisher").load_state_dict(state)
    other = SSLFisher().bind(build("vit_swiglu"))
    with pytest.raises(CheckpointError, match="does not fit this model"):
        other.load_state_dict(state)


def test_state_before_setup_round_trips():
    """A configuration's state is the empty one; loaded into a bound scorer it resumes as fresh."""
    fresh = SSLFisher()
    state = fresh.state_dict()
    assert state["batches"] == 0 and state["accumulators"] == {}
    scorer = SSLFisher().bind(build("dino_vit"))
    scorer.update(views(2))
    scorer.load_state_dict(state)
    assert scorer.state_dict()["batches"] == 0


def test_snip_magnitude_does_not_depend_on_the_batch_order():
    model, x = build("vit_swiglu"), views(8)
    batches = list(x.split(2))
    forward = scores_of(SNIPMagnitude(), model, batches)
    backward = scores_of(SNIPMagnitude(), model, batches[::-1])
    for a, b in zip(forward.heads + forward.neurons, backward.heads + backward.neurons):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)


def test_snip_magnitude_uses_the_gradient_summed_over_batches():
    """The reference code's saliency: |(g_1 + g_2) * w| + alpha w^2 from the summed batch gradients."""
    model, x = build("vit_swiglu"), views(4)
    batches = list(x.split(2))
    scores = scores_of(SNIPMagnitude(alpha=0.01), model, batches)
    grads = [full_backward_grads(model, batch).blocks[0].mlp for batch in batches]
    mlp = model.blocks[0].mlp
    expected = 0
    for name in ("fc1_g", "fc1_x"):  # a SwiGLU neuron: its row of each half
        w = getattr(mlp, name).weight.detach()
        g = sum(getattr(m, name).weight.grad for m in grads)
        expected = expected + ((g * w).abs() + 0.01 * w.square()).mean(dim=1) / 2
    torch.testing.assert_close(scores.neurons[0], expected, rtol=1e-4, atol=0)
