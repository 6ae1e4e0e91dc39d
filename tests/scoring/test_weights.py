import pytest
import torch

from scoring_helpers import CORE, build
from snapvit_pl.errors import CheckpointError
from snapvit_pl.scoring import LAMP, Magnitude, RandomScorer, ScoringError, lamp


def compute(scorer, model):
    scorer = scorer.bind(model)
    return scorer.compute()


@pytest.mark.parametrize("family", CORE)
def test_lamp_scores_in_unit_interval_with_block_max_one(family):
    scores = compute(LAMP(), build(family))
    for s in scores.heads + scores.neurons:
        assert bool(((s > 0) & (s <= 1)).all())
        assert s.max() == 1 and int((s == 1).sum()) == 1


def test_lamp_formula_and_ties():
    m2 = torch.tensor([4.0, 1.0, 9.0, 1.0])
    # denominators: 4 -> 4+9, 1 -> all (both 1s count), 9 -> 9
    torch.testing.assert_close(lamp(m2), torch.tensor([4 / 13, 1 / 15, 1.0, 1 / 15], dtype=torch.float64))
    assert torch.equal(lamp(torch.zeros(3)), torch.zeros(3, dtype=torch.float64))


def test_lamp_ranks_like_magnitude_within_a_block_and_is_scale_free_across_blocks():
    model = build("dino_vit")
    with torch.no_grad():
        model.blocks[1].mlp.fc1.weight.mul_(100)  # a block with a much larger weight scale
    mag, lmp = compute(Magnitude(), model), compute(LAMP(), model)
    for m, l in zip(mag.heads + mag.neurons, lmp.heads + lmp.neurons):
        assert torch.equal(m.argsort(), l.argsort())
    assert mag.neurons[1].min() > mag.neurons[0].max()  # magnitude: block 1 dominates
    assert lmp.neurons[1].max() == lmp.neurons[0].max() == 1  # LAMP: comparable


def test_magnitude_heads_use_q_k_and_v_rows():
    model = build("eva02_separate_qkv")
    attn = model.blocks[0].attn
    scores = compute(Magnitude(p=1), model)
    rows = torch.cat([getattr(attn, f"{n}_proj").weight.view(4, -1) for n in "qkv"], dim=1)
    torch.testing.assert_close(scores.heads[0], rows.abs().sum(1))
    with pytest.raises(ScoringError, match="p must be > 0"):
        Magnitude(p=0)


def test_random_scores_are_seeded():
    model = build("dino_vit")
    a, b, c = compute(RandomScorer(3), model), compute(RandomScorer(3), model), compute(RandomScorer(4), model)
    assert torch.equal(a.neurons[1], b.neurons[1]) and not torch.equal(a.neurons[1], c.neurons[1])
    assert bool(((a.neurons[0] >= 0) & (a.neurons[0] < 1)).all())


def test_data_free_state_round_trip():
    scorer = LAMP().bind(build("dino_vit"))
    scorer.update(torch.zeros(1))  # ignored
    scorer.reduce(lambda t: t)  # nothing to reduce
    LAMP().load_state_dict(scorer.state_dict())
    with pytest.raises(CheckpointError, match="scorer state of lamp cannot resume magnitude"):
        Magnitude().load_state_dict(scorer.state_dict())
