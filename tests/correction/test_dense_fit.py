"""The correction that refits each pruned block to the dense model's outputs (``correction.method: dense_fit``)."""
import copy
import os
from dataclasses import replace
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from families import FAMILIES, random_subnet
from calibration import half_subnet, model_of, smooth_images

from snapvit_pl.correction import CorrectionSettings, RidgeFit, correct_and_prune, fit_to_dense_and_prune
from snapvit_pl.errors import ConfigError, UnsupportedModelError
from snapvit_pl.models import BackboneSpec, Subnet, architecture, load_backbone, prunable_blocks, prune_

#: Every family whose blocks are pre-norm (all of the test matrix).
PRE_NORM_FAMILIES = sorted(FAMILIES)


def feature_error(model, dense, images):
    with torch.no_grad():
        return F.mse_loss(model.forward_features(images), dense.forward_features(images)).item()


@pytest.mark.parametrize("family", PRE_NORM_FAMILIES)
def test_every_family_gets_the_architecture_of_prune_and_a_smaller_error_than_as_cut(family):
    model = model_of(family)
    subnet = random_subnet(model, seed=3)
    fitted = fit_to_dense_and_prune(copy.deepcopy(model), subnet, smooth_images(96, 1), batch_size=32)
    cut = prune_(copy.deepcopy(model), subnet)
    assert architecture(fitted) == architecture(cut)
    held_out = smooth_images(32, 2)
    assert all(torch.isfinite(p).all() for p in fitted.parameters())
    assert feature_error(fitted, model, held_out) < feature_error(cut, model, held_out)


def _with_duplicates(model: torch.nn.Module) -> tuple[torch.nn.Module, Subnet]:
    """``model`` with the second half of each block's heads and MLP neurons made copies of the first half (same
    q, k, v rows; same fc1 rows and biases), their output columns left as they were (not zero), and the subnet that
    keeps the first half: the pruned blocks can then reproduce the dense ones exactly (the removed units' outputs
    equal kept units' outputs), but only with other proj / fc2 weights than the ones cut."""
    model = copy.deepcopy(model)
    heads, neurons = [], []
    with torch.no_grad():
        for block, units in zip(model.blocks, prunable_blocks(model)):
            h, d = units.heads.num_units, block.attn.head_dim
            qkv = block.attn.qkv.weight.view(3, h, d, -1)
            qkv[:, h // 2:] = qkv[:, :h // 2]
            if block.attn.qkv.bias is not None:
                bias = block.attn.qkv.bias.view(3, h, d)
                bias[:, h // 2:] = bias[:, :h // 2]
            n = units.neurons.num_units
            block.mlp.fc1.weight[n // 2:] = block.mlp.fc1.weight[:n // 2]
            block.mlp.fc1.bias[n // 2:] = block.mlp.fc1.bias[:n // 2]
            heads.append(torch.arange(h // 2))
            neurons.append(torch.arange(n // 2))
    return model, Subnet(heads, neurons)


def test_a_dense_model_the_pruned_one_can_reach_is_reproduced_exactly():
    """Removed units that duplicate kept ones: the exact least-squares solution moves their output columns onto the
    kept copies, so every block's output, and the model's, equals the dense model's (as cut, it does not)."""
    model, subnet = _with_duplicates(model_of("dino_vit"))
    images = smooth_images(64, 1)
    fitted = fit_to_dense_and_prune(copy.deepcopy(model), subnet, images, damp_fraction=1e-12)
    cut = prune_(copy.deepcopy(model), subnet)
    held_out = smooth_images(16, 2)
    with torch.no_grad():
        dense = model.forward_features(held_out)
        assert (fitted.forward_features(held_out) - dense).abs().max() < 1e-5
        assert (cut.forward_features(held_out) - dense).abs().max() > 1e-2


def test_rank_deficient_calibration_data_gives_finite_weights_pulled_toward_the_cut():
    """One image: 17 tokens for 128 fc2 inputs (rank 17 at most), and one dead input column: the ridge keeps the
    system definite, and where the data say nothing the weights stay as cut."""
    model = model_of("dino_vit")
    subnet = half_subnet(model)
    one = smooth_images(1, 1)
    fitted = fit_to_dense_and_prune(copy.deepcopy(model), subnet, one)
    cut = prune_(copy.deepcopy(model), subnet)
    assert all(torch.isfinite(p).all() for p in fitted.parameters())
    assert feature_error(fitted, model, one) < feature_error(cut, model, one)
    layer = torch.nn.Linear(4, 3)
    fit = RidgeFit(layer)
    inputs = torch.randn(10, 4)
    inputs[:, 2] = 0  # a dead input: its weights are not determined by the data
    fit.add(inputs, torch.randn(10, 3))
    weight, bias = fit.solve()
    assert torch.isfinite(weight).all() and torch.isfinite(bias).all()
    assert torch.allclose(weight[:, 2], layer.weight[:, 2])


def test_the_statistics_do_not_grow_with_the_number_of_calibration_images():
    layer = torch.nn.Linear(16, 8)
    small, large = RidgeFit(layer), RidgeFit(layer)
    small.add(torch.randn(10, 16), torch.randn(10, 8))
    for _ in range(50):
        large.add(torch.randn(1000, 16), torch.randn(1000, 8))
    held = lambda fit: fit.gram.numel() + fit.cross.numel()  # noqa: E731
    assert held(small) == held(large) == 17 * 17 + 17 * 8


def test_the_fit_is_the_exact_ridge_solution_with_a_free_bias():
    torch.manual_seed(0)
    layer = torch.nn.Linear(5, 3)
    inputs, targets = torch.randn(200, 5), torch.randn(200, 3)
    fit = RidgeFit(layer)
    for chunk in range(0, 200, 64):  # batch by batch
        fit.add(inputs[chunk:chunk + 64], targets[chunk:chunk + 64])
    weight, bias = fit.solve(damp_fraction=0.0)
    expected = torch.linalg.lstsq(torch.cat([inputs, torch.ones(200, 1)], 1).double(), targets.double()).solution
    assert torch.allclose(weight.double(), expected[:5].T, atol=1e-5)
    assert torch.allclose(bias.double(), expected[5], atol=1e-5)


def test_blocks_that_lose_nothing_and_everything_outside_the_blocks_are_unchanged():
    model = model_of("dino_vit")
    subnet = Subnet.full(model)
    subnet.heads[1], subnet.neurons[1] = torch.tensor([0, 2]), torch.arange(0, 256, 2)
    fitted = fit_to_dense_and_prune(copy.deepcopy(model), subnet, smooth_images(16, 0)).state_dict()
    cut = prune_(copy.deepcopy(model), subnet).state_dict()
    changed = {"blocks.1.attn.proj.weight", "blocks.1.attn.proj.bias", "blocks.1.mlp.fc2.weight", "blocks.1.mlp.fc2.bias"}
    assert all(torch.equal(fitted[k], cut[k]) for k in cut if k not in changed)
    assert all(not torch.equal(fitted[k], cut[k]) for k in changed)
    assert fit_to_dense_and_prune(model, Subnet.full(model), smooth_images(4, 0)) is model


def test_a_direct_caller_s_unknown_refit_is_refused_before_anything_changes():
    """A run's ``correction.refit`` is checked once, by its settings; a Python caller's word is checked here, even when
    the subnet removes nothing (a typo never falls back to ``pruned``)."""
    model = model_of("dino_vit")
    before = copy.deepcopy(model.state_dict())
    for subnet in (random_subnet(model, seed=3), Subnet.full(model)):
        with pytest.raises(ConfigError, match="refit must be one of pruned, following, got 'folowing'"):
            fit_to_dense_and_prune(model, subnet, smooth_images(4, 0), refit="folowing")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_post_norm_block_is_refused_before_anything_changes():
    from timm.models.vision_transformer import ResPostBlock

    spec = BackboneSpec("vit_small_patch16_224", False, None,
                        dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=0,
                             block_fn=ResPostBlock))
    model = load_backbone(spec).eval()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(UnsupportedModelError, match="dense_fit needs pre-norm blocks.*sparsegpt"):
        fit_to_dense_and_prune(model, half_subnet(model), smooth_images(4, 0))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_it_beats_the_sparsegpt_update_on_held_out_images():
    """What it is for: the drift from the blocks before is undone too (measured here about 0.6x the error of the
    SparseGPT-style update on this random model)."""
    model = model_of("dino_vit")
    subnet = half_subnet(model)
    images, held_out = smooth_images(128, 1), smooth_images(64, 2)
    fitted = fit_to_dense_and_prune(copy.deepcopy(model), subnet, images)
    updated = correct_and_prune(copy.deepcopy(model), subnet, images)
    assert feature_error(fitted, model, held_out) < feature_error(updated, model, held_out)


def test_the_pipeline_runs_it_as_correction_method_dense_fit():
    from snapvit_pl.pipeline.extraction import Correction

    model = model_of("dino_vit")
    subnet = half_subnet(model)
    images = smooth_images(40, 1)
    settings = CorrectionSettings(enabled=True, method="dense_fit", num_samples=40, batch_size=8, held_out=0)
    corrected, record = Correction(settings, images)(model, subnet)
    assert record["method"] == "dense_fit" and record["num_samples"] == 40 and record["held_out_images"] == 0
    assert record["kept"] == "corrected" and "output_check" not in record  # nothing held out: nothing to check on
    expected = fit_to_dense_and_prune(copy.deepcopy(model), subnet, images, batch_size=8)
    assert all(torch.equal(a, b) for a, b in zip(corrected.state_dict().values(), expected.state_dict().values()))
    # the default: the last fifth held out before the fit, each block's variant and the whole model judged on it
    corrected, record = Correction(replace(settings, held_out=0.2), images)(model, subnet)
    assert record["num_samples"] == 40 and record["held_out_images"] == 8
    choices = []
    expected = fit_to_dense_and_prune(copy.deepcopy(model), subnet, images[:32], batch_size=8, held_out=images[32:],
                                      choices=choices)
    assert [c["kept"] for c in choices] == [b["kept"] for b in record["blocks"]]
    if record["kept"] == "as cut":
        expected = prune_(copy.deepcopy(model), subnet)
    assert all(torch.equal(a, b) for a, b in zip(corrected.state_dict().values(), expected.state_dict().values()))


def test_reconstruction_steps_auto_run_on_accelerators_only():
    """``reconstruct_steps: auto`` (the default): the chosen steps on an accelerator, none on the CPU; a number of
    steps is used as given on any device; any other word is refused naming the setting."""
    from snapvit_pl.correction.settings import RECONSTRUCT_STEPS
    from snapvit_pl.errors import ConfigError
    from snapvit_pl.pipeline.extraction import Correction

    auto = CorrectionSettings()
    assert auto.reconstruct_steps == "auto" and auto.steps_on("cpu") == 0
    assert auto.steps_on("cuda") == auto.steps_on(torch.device("mps")) == RECONSTRUCT_STEPS > 0
    assert CorrectionSettings(reconstruct_steps=7).steps_on("cpu") == CorrectionSettings(reconstruct_steps=7).steps_on("cuda") == 7
    with pytest.raises(ConfigError, match="correction.reconstruct_steps must be an integer >= 0 or auto, got 'many'"):
        CorrectionSettings(reconstruct_steps="many")
    model, subnet = model_of("dino_vit"), None
    subnet = half_subnet(model)
    images = smooth_images(32, 1)
    _, on_cpu = Correction(CorrectionSettings(enabled=True, num_samples=32, batch_size=8), images)(model, subnet)
    assert "reconstruction" not in on_cpu  # auto on the CPU: the fit alone
    _, stepped = Correction(CorrectionSettings(enabled=True, num_samples=32, batch_size=8, reconstruct_steps=3,
                                               reconstruct_lr=1e-4), images)(model, subnet)
    assert stepped["reconstruction"]["steps"] == 3 and stepped["reconstruction"]["lr"] == 1e-4
    assert len(stepped["reconstruction"]["blocks"]) > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _half_of_the_images(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        model = model_of("dino_vit")
        images = smooth_images(64, 1)[rank * 32:(rank + 1) * 32]
        fitted = fit_to_dense_and_prune(model, half_subnet(model), images, batch_size=16, reduce=dist.all_reduce)
        torch.save(fitted.state_dict(), f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_with_half_the_images_each_give_one_processes_weights(tmp_path):
    mp.spawn(_half_of_the_images, args=(_free_port(), str(tmp_path)), nprocs=2)
    model = model_of("dino_vit")
    alone = fit_to_dense_and_prune(copy.deepcopy(model), half_subnet(model), smooth_images(64, 1), batch_size=16)
    for rank in (0, 1):
        shared = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for key, value in alone.state_dict().items():
            assert torch.allclose(shared[key], value, atol=1e-6, rtol=1e-5), (rank, key)


def test_reconstruction_steps_lower_the_held_out_error_and_never_keep_a_worse_block():
    """Block-wise reconstruction after the fit: the held-out error of every block ends at or below the fit's (the
    best step is kept), and lower on this random model; zero steps change nothing."""
    from snapvit_pl.correction import Reconstruction

    model = model_of("dino_vit")
    subnet = half_subnet(model)
    images, held_out = smooth_images(64, 1), smooth_images(32, 2)
    fitted = fit_to_dense_and_prune(copy.deepcopy(model), subnet, images)
    steps = Reconstruction(100, lr=3e-4, batch_size=16, check_every=10)
    stepped = fit_to_dense_and_prune(copy.deepcopy(model), subnet, images, reconstruct=steps)
    assert len(steps.log) == 2 and all(b["held_out_error_after"] <= b["held_out_error_before"] for b in steps.log)
    assert any(b["steps_kept"] > 0 for b in steps.log)
    assert feature_error(stepped, model, held_out) < feature_error(fitted, model, held_out)
    none = fit_to_dense_and_prune(copy.deepcopy(model), subnet, images, reconstruct=Reconstruction(0))
    assert all(torch.equal(a, b) for a, b in zip(none.state_dict().values(), fitted.state_dict().values()))
    assert [p.requires_grad for p in stepped.parameters()] == [p.requires_grad for p in fitted.parameters()]


def test_held_out_images_never_reach_the_fit():
    """Issue 75: the held-out images judge the fit, they are not fitted on. Poisoned (NaN), they leave the first
    block's fitted weights bit for bit those of a run without them, and finite; every block then keeps its weights as
    cut, since nothing can vouch for the fit."""
    from snapvit_pl.correction import dense_fit

    model, images = model_of("dino_vit"), smooth_images(32, 1)
    subnet = half_subnet(model)
    written = {}

    def first_fit(poison):
        calls = []
        original = dense_fit._write
        dense_fit._write = lambda layer, w, b: (calls.append((w.clone(), b.clone())), original(layer, w, b))
        try:
            choices = []
            fitted = fit_to_dense_and_prune(copy.deepcopy(model), subnet, images, batch_size=8, held_out=poison,
                                            choices=choices)
        finally:
            dense_fit._write = original
        return calls[:2], choices, fitted  # block 0's proj and fc2

    written["none"], _, _ = first_fit(None)
    written["clean"], _, _ = first_fit(smooth_images(8, 2))
    written["nan"], choices, poisoned = first_fit(torch.full((8, 3, 32, 32), float("nan")))
    for name in ("clean", "nan"):
        for (w, b), (w0, b0) in zip(written[name], written["none"]):
            assert torch.equal(w, w0) and torch.equal(b, b0) and torch.isfinite(w).all(), name
    assert [c["kept"] for c in choices] == ["as cut"] * len(model.blocks)
    cut = prune_(copy.deepcopy(model), subnet)
    assert all(torch.equal(a, b) for a, b in zip(poisoned.state_dict().values(), cut.state_dict().values()))


def test_a_block_the_fit_makes_worse_on_held_out_images_keeps_its_weights_as_cut():
    """Fitted on one image with a vanishing ridge, the blocks over-fit it; judged on other images, each keeps its
    weights as cut, and the model is the model as cut bit for bit."""
    model = model_of("dino_vit")
    subnet = half_subnet(model)
    choices = []
    fitted = fit_to_dense_and_prune(copy.deepcopy(model), subnet, smooth_images(1, 1), damp_fraction=1e-12,
                                    held_out=torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0)),
                                    choices=choices)
    assert len(choices) == len(model.blocks)
    for choice in choices:
        errors = choice["held_out_error"]
        assert errors["fitted"] > errors["as cut"] and choice["kept"] == "as cut", choice
    cut = prune_(copy.deepcopy(model), subnet)
    assert all(torch.equal(a, b) for a, b in zip(fitted.state_dict().values(), cut.state_dict().values()))
    # on images like those it was fitted on, the fit is kept where it is closer to the dense block
    choices = []
    fit_to_dense_and_prune(copy.deepcopy(model), subnet, smooth_images(64, 1), held_out=smooth_images(16, 2),
                           choices=choices)
    assert all(c["kept"] == min(c["held_out_error"], key=c["held_out_error"].get) for c in choices)
    assert any(c["kept"] == "fitted" for c in choices)


def test_reconstruction_stops_when_the_held_out_error_stops_improving():
    """``patience``: a block's steps end once that many pass without a lower held-out error; ``seconds``: once the
    model's time is spent (shared by its blocks); neither: every step runs."""
    from snapvit_pl.correction import Reconstruction

    model, images, held_out = model_of("dino_vit"), smooth_images(32, 1), smooth_images(8, 2)
    subnet = half_subnet(model)
    # a rate so high that no step after the first few improves: patience ends each block early
    patient = Reconstruction(400, lr=1.0, batch_size=8, check_every=5, patience=20)
    fit_to_dense_and_prune(copy.deepcopy(model), subnet, images, held_out=held_out, reconstruct=patient)
    for block in patient.log:
        assert block["steps_run"] - block["steps_kept"] <= 20 + 5 and block["steps_run"] < 400, block
    endless = Reconstruction(60, lr=1.0, batch_size=8, check_every=5, patience=None)
    fit_to_dense_and_prune(copy.deepcopy(model), subnet, images, held_out=held_out, reconstruct=endless)
    assert [b["steps_run"] for b in endless.log] == [60] * len(model.blocks)
    timed = Reconstruction(10 ** 7, lr=1e-4, batch_size=8, patience=None, seconds=0.5)
    started = time.perf_counter()
    fit_to_dense_and_prune(copy.deepcopy(model), subnet, images, held_out=held_out, reconstruct=timed)
    assert time.perf_counter() - started < 30 and all(0 < b["steps_run"] < 10 ** 7 for b in timed.log)
