import copy
import pickle
from typing import Optional

import pytest
import torch

from scoring_helpers import CORE, build, labels, views
from snapvit_pl.errors import CheckpointError, ConfigError, DataError, UnsupportedModelError
from snapvit_pl.models import prunable_blocks
from snapvit_pl.scoring.base import Accumulator, ScoringContext
from snapvit_pl.scoring import (
    FLAP, Activation, GaussNewtonGreedy, Taylor, WandaSP, LAMP, SCORERS, LabelFisher, LocalScores, Magnitude, RandomScorer, ScoringError, SNIPMagnitude, SSLFisher,
    build_scorer,
)


def run(scorer, model, batches):
    scorer = scorer.bind(model)
    if scorer.requires_data:
        for batch in batches:
            scorer.update(batch)
    scorer.reduce(lambda t: t)
    return scorer.compute()


@pytest.mark.parametrize("family", CORE)
@pytest.mark.parametrize("name", sorted(SCORERS))
def test_every_scorer_gives_finite_nonconstant_scores(family, name):
    model = build(family, num_classes=5 if name == "label_fisher" else None)
    x = views(4)
    scores = run(build_scorer(name), model, [(x, labels(4))])
    scores.validate(model)
    for block, h, n in zip(prunable_blocks(model), scores.heads, scores.neurons):
        assert h.shape == (block.heads.num_units,) and n.shape == (block.neurons.num_units,)
        assert h.dtype == n.dtype == torch.float32 and h.device.type == "cpu"
        assert torch.isfinite(h).all() and torch.isfinite(n).all()
        assert h.std() > 0 and n.std() > 0, "scores must separate units"


def test_ssl_fisher_needs_no_labels():
    scorer = SSLFisher()
    assert scorer.requires_data and not scorer.requires_labels
    scorer = scorer.bind(build("dino_vit"))
    out = scorer.update(views(4))  # a bare image tensor, no labels
    assert set(out) == {"loss"} and out["loss"] > 0
    assert scorer.compute().heads[0].shape == (4,)


def test_data_free_scorers_need_no_update():
    model = build("dino_vit")
    for scorer in (Magnitude(), LAMP(), RandomScorer()):
        assert not scorer.requires_data and not scorer.requires_labels
        scorer = scorer.bind(model)
        scorer.compute().validate(model)


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_same_seed_and_data_give_identical_scores(name):
    results = []
    for _ in range(2):
        results.append(run(build_scorer(name), build("vit_swiglu"), [(views(4), labels(4))]))
    (a, b) = results
    assert all(torch.equal(x, y) for x, y in zip(a.heads + a.neurons, b.heads + b.neurons))


def test_update_leaves_model_flags_grads_and_mode_as_found():
    model = build("dino_vit").train()
    model.patch_embed.proj.weight.requires_grad_(False)
    model.blocks[0].norm1.eval()  # a mixed-mode module tree must come back mixed
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    modes = {n: m.training for n, m in model.named_modules()}
    scorer = SSLFisher().bind(model)
    scorer.update(views(2))
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert {n: m.training for n, m in model.named_modules()} == modes
    assert all(p.grad is None for p in model.parameters()), "scorers must not accumulate .grad"
    assert all(not p.requires_grad for p in scorer.teacher.parameters())


def test_runs_under_inference_mode_with_the_same_result():
    model, x = build("dino_vit"), views(4)
    expected = run(SSLFisher(), model, [x])
    scorer = SSLFisher().bind(model)
    with torch.inference_mode():
        scorer.update(x)
    assert torch.equal(scorer.compute().neurons[1], expected.neurons[1])


def test_given_teacher_is_used():
    model = build("dino_vit")
    other = build("dino_vit")
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    a, b = SSLFisher(), SSLFisher()
    a = a.bind(model)
    b = b.bind(model, ScoringContext(teacher=other))
    assert b.teacher is other
    assert a.update(views(2))["loss"] != b.update(views(2))["loss"]


def test_build_scorer_names_and_errors():
    assert {n for n, c in SCORERS.items() if c.__module__.startswith("snapvit_pl.")} == {
        "ssl_fisher", "label_fisher", "magnitude", "lamp", "snip_magnitude", "random", "activation", "wanda_sp", "flap",
        "taylor", "sensitivity", "ssl_mask_fisher", "gn_greedy"}
    assert all(cls.name == name for name, cls in SCORERS.items())
    assert isinstance(build_scorer("ssl_fisher", reduction="fisher"), SSLFisher)
    assert build_scorer("snip_magnitude", n_global=1).n_global == 1
    with pytest.raises(ScoringError, match="unknown scorer .fisher.; choose one of activation, flap, gn_greedy"):
        build_scorer("fisher")
    with pytest.raises(ConfigError, match="reduction must be one of squared_sum, fisher, got 'mean'"):
        SSLFisher(reduction="mean")
    with pytest.raises(ScoringError, match="n_global must be >= 1"):
        SSLFisher(n_global=0)


def test_a_scorer_registers_under_the_one_name_it_gives_itself_and_a_taken_name_is_refused():
    """The name is written once, in the class: defining it registers it (a user's scorer too); a bound copy gets
    its own copy of a list argument, so a run never changes the configuration."""
    from snapvit_pl.scoring import Scorer

    class Counted(Scorer):
        name = "test_counted"
        requires_data = False

        def __init__(self, seen: Optional[list] = None):
            self.seen = [] if seen is None else seen

        def setup(self, model, context=None):
            super().setup(model, context)
            self.seen.append(len(self.blocks))

        def compute(self):
            return LocalScores([torch.ones(b.heads.num_units) for b in self.blocks],
                               [torch.ones(b.neurons.num_units) for b in self.blocks])

    try:
        assert SCORERS["test_counted"] is Counted and isinstance(build_scorer("test_counted"), Counted)
        configuration = Counted()
        bound = configuration.bind(build("dino_vit"))
        assert bound.seen == [len(bound.blocks)] and configuration.seen == []
        with pytest.raises(TypeError, match="scorer name 'magnitude' of .*Impostor is taken by "
                                            "snapvit_pl.scoring.weights.Magnitude"):
            class Impostor(Magnitude):
                name = "magnitude"
        assert SCORERS["magnitude"] is Magnitude
    finally:
        SCORERS.pop("test_counted", None)


def test_a_specification_is_frozen_and_holds_no_statistics():
    """No statistics can sit on a specification: its attributes cannot be set once made, and what binds or feeds a
    scorer (``setup``, ``update``, ``reduce``, ``compute``, a state's loading) refuses it, naming ``bind``; an
    accumulator is not bound again."""
    model, x = build("vit_swiglu"), torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    spec = GaussNewtonGreedy(probes=1)
    with pytest.raises(ScoringError, match=r"GaussNewtonGreedy is a specification: its arguments are fixed once made "
                                           r"\(probes cannot be set\)"):
        spec.probes = 2
    with pytest.raises(ScoringError, match="fixed once made"):
        del spec.probes
    for call in (lambda: spec.setup(model), lambda: spec.update(x), lambda: spec.reduce(lambda t: t),
                 lambda: spec.compute()):
        with pytest.raises(ScoringError, match=r"is a specification; bind it to the model.*scorer.bind\(model"):
            call()
    bound = spec.bind(model)
    with pytest.raises(ScoringError, match="a specification holds no statistics"):
        spec.load_state_dict(bound.state_dict())
    with pytest.raises(ScoringError, match="already bound to a model"):
        bound.bind(model)
    bound.update(x)
    bound.reduce(lambda t: t)
    assert bound.compute().num_blocks == len(bound.blocks)
    assert spec.probes == 1 and set(vars(spec)) == set(vars(GaussNewtonGreedy(probes=1)))  # nothing left on it


@pytest.mark.parametrize("scorer", [SSLFisher(3, "fisher"), LabelFisher(), SNIPMagnitude(alpha=0.01), Magnitude(1),
                                    LAMP(), RandomScorer(7), Activation("mean"), WandaSP(), FLAP("none"),
                                    Taylor(1, "mean")], ids=repr)
def test_a_specification_stays_one_when_a_run_binds_it(scorer):
    """What a run's settings hold is the specification: a run binds an accumulator (``bind``: the class's
    accumulator type), which holds the model and the statistics; the specification pickles (a spawned DDP process)
    and copies as plain data."""
    bound = scorer.bind(build("vit_swiglu"))
    assert bound is not scorer and isinstance(bound, type(scorer)) and bound.config() == scorer.config()
    assert isinstance(bound, Accumulator) and not isinstance(scorer, Accumulator)
    assert type(bound) is type(scorer).accumulator_type() is type(scorer.bind(build("vit_swiglu")))
    assert bound.model is not None and getattr(scorer, "model", None) is None and not hasattr(scorer, "_acc")
    clone = pickle.loads(pickle.dumps(scorer))
    assert type(clone) is type(scorer) and clone.config() == scorer.config() and repr(clone) == repr(scorer)
    assert vars(clone) == vars(scorer) and copy.deepcopy(scorer).config() == scorer.config()


def test_label_fisher_errors():
    with pytest.raises(UnsupportedModelError, match="num_classes=0; use a model with a head or a label-free"):
        LabelFisher().bind(build("dino_vit"))
    scorer = LabelFisher().bind(build("dino_vit", num_classes=5))
    with pytest.raises(DataError, match="label_fisher needs \\(images, labels\\) batches but got images only"):
        scorer.update(views(2)[:, 0])
    with pytest.raises(DataError, match=r"labels must lie in \[0, 5\)"):
        scorer.update((views(2)[:, 0], torch.tensor([0, 5])))
    with pytest.raises(DataError, match="one class label per image"):
        scorer.update((views(2)[:, 0], torch.zeros(2, 4, dtype=torch.long)))


def test_label_fisher_multicrop_uses_every_view_with_its_label():
    model = build("dino_vit", num_classes=5)
    x, y = views(3, n_views=2), labels(3)
    multi = run(LabelFisher(), model, [(x, y)])
    flat = run(LabelFisher(), model, [(x.flatten(0, 1), y.repeat_interleave(2))])
    torch.testing.assert_close(multi.neurons[0], flat.neurons[0], rtol=1e-5, atol=0)


@pytest.mark.parametrize("cls", [SSLFisher, SNIPMagnitude])
def test_ssl_scorers_reject_plain_images(cls):
    scorer = cls().bind(build("dino_vit"))
    with pytest.raises(DataError, match="multi-crop batches .* V >= 2 .* multi-crop view transform"):
        scorer.update((views(2)[:, 0], labels(2)))
    with pytest.raises(DataError, match="V >= 2"):
        scorer.update(views(2, n_views=1))
    wide = SSLFisher(n_global=4).bind(build("dino_vit"))
    with pytest.raises(DataError, match="3 views but n_global=4"):
        wide.update(views(2, n_views=3))


def test_bad_batches_and_order_errors():
    scorer = SSLFisher()
    with pytest.raises(ScoringError, match="ssl_fisher is a specification; bind it to the model first"):
        scorer.update(views(2))
    scorer = scorer.bind(build("dino_vit"))
    with pytest.raises(DataError, match="saw no batches"):
        scorer.compute()
    with pytest.raises(DataError, match="image tensor or an \\(images, labels\\) pair"):
        scorer.update({"image": views(2)})
    with pytest.raises(DataError, match="got shape \\(2, 3, 32\\)"):
        scorer.update(torch.zeros(2, 3, 32))
    with pytest.raises(DataError, match="normalised float"):
        scorer.update(torch.zeros(2, 2, 3, 32, 32, dtype=torch.uint8))


def test_local_scores_round_trip_and_validation():
    model = build("dino_vit")
    scores = run(Magnitude(), model, [])
    back = LocalScores.from_dict(scores.to_dict())
    assert all(torch.equal(a, b) for a, b in zip(back.heads + back.neurons, scores.heads + scores.neurons))
    assert LocalScores.from_dict({"heads": scores.heads, "neurons": scores.neurons}).num_blocks == 2
    with pytest.raises(CheckpointError, match="scores for 1 attention / 1 MLP blocks, but the model has 2 blocks"):
        LocalScores(scores.heads[:1], scores.neurons[:1]).validate(model)
    with pytest.raises(CheckpointError, match="3 scores for block 1's 256 MLP neurons; these scores belong to"):
        LocalScores(scores.heads, [scores.neurons[0], torch.ones(3)]).validate(model)
    with pytest.raises(CheckpointError, match=r"a non-finite score \(nan\) for block 0's head 0 \(and 3 more\)"):
        LocalScores([torch.full((4,), float("nan")), scores.heads[1]], scores.neurons).validate(model)
    with pytest.raises(CheckpointError, match="'heads' and 'neurons'"):
        LocalScores.from_dict({"heads": []})


def test_selectable_by_class_path():
    from jsonargparse import ArgumentParser

    from snapvit_pl.scoring import Scorer

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--scorer", type=Scorer)
    for class_path, init_args, expected in [
        ("snapvit_pl.scoring.SSLFisher", {"reduction": "fisher"}, SSLFisher(reduction="fisher")),
        ("snapvit_pl.scoring.LAMP", {}, LAMP()),
        ("snapvit_pl.scoring.RandomScorer", {"seed": 3}, RandomScorer(3)),
    ]:
        cfg = parser.parse_object({"scorer": {"class_path": class_path, "init_args": init_args}})
        instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # renamed in 4.49
        scorer = instantiate(cfg).scorer
        assert type(scorer) is type(expected) and scorer.config() == expected.config()


def test_follows_the_model_to_another_device_or_parameter_set():
    """Lightning's setup hook runs before the model is moved: the scorer re-binds on the next update."""
    model, x = build("dino_vit"), views(2)
    expected = run(SSLFisher(), model, [x, x])
    scorer = SSLFisher().bind(model)
    scorer.update(x)
    scorer._device = torch.device("meta")  # pretend the model moved since setup
    with torch.no_grad():  # and got new parameter objects
        model.blocks[0].attn.qkv.weight = torch.nn.Parameter(model.blocks[0].attn.qkv.weight.clone())
    scorer.update(x)
    assert torch.equal(scorer.compute().heads[0], expected.heads[0])


def test_self_supervised_scorers_expect_the_global_views_the_data_makes():
    from snapvit_pl.data.transforms import N_GLOBAL_VIEWS
    from snapvit_pl.scoring import SNIPMagnitude, SSLFisher

    assert SSLFisher().global_views == SNIPMagnitude().global_views == N_GLOBAL_VIEWS


def test_forward_only_and_sensitivity_scorers_get_plain_views():
    from snapvit_pl.pipeline.importance import scoring_views
    from snapvit_pl.scoring import OutputSensitivity, SSLMaskFisher

    assert {scoring_views(s) for s in (Activation(), WandaSP(), FLAP(), OutputSensitivity())} == {"plain"}
    assert scoring_views(Taylor()) == scoring_views(SSLMaskFisher()) == scoring_views(SSLFisher()) == "multicrop"
    assert scoring_views(LabelFisher()) == "labeled" and scoring_views(Magnitude()) == "plain"


def test_allocations_compare_blocks_as_published():
    torch.manual_seed(0)
    scales = [1.0, 100.0, 0.01]  # raw scores on very different scales per block
    local = LocalScores([torch.rand(6) * s for s in scales], [torch.rand(40) * s for s in scales])
    assert local.allocated("global") is local
    uniform = local.allocated("uniform")
    # the same share of every block below any global threshold: a 50% cut takes 20 neurons and 3 heads from each
    neurons = torch.cat(uniform.neurons)
    threshold = neurons.sort().values[len(neurons) // 2 - 1]
    assert [int((n <= threshold).sum()) for n in uniform.neurons] == [20, 20, 20]
    for raw, ranked in zip(local.heads, uniform.heads):  # the order within a block is kept
        assert torch.equal(raw.argsort(), ranked.argsort())
    standardized = local.allocated("standardized")
    for block in standardized.heads + standardized.neurons:
        assert abs(float(block.mean())) < 1e-5 and float(block.std(unbiased=False)) == pytest.approx(1.0, abs=1e-5)
    assert torch.equal(LocalScores([torch.ones(3)], [torch.ones(4)]).allocated("standardized").heads[0], torch.zeros(3))
    with pytest.raises(ConfigError, match="allocation must be one of global, uniform, standardized"):
        local.allocated("layerwise")
