import math

from torch import nn

from snapvit_pl.eval.throughput import measure_throughput


def mlp(hidden):
    return nn.Sequential(nn.Linear(512, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 512))


def test_throughput_is_positive_and_finite():
    model = mlp(256).train()
    result = measure_throughput(model, input_shape=(512,), batch_size=32, warmup=1, repeats=3, device="cpu")
    assert result.images_per_second > 0 and math.isfinite(result.images_per_second)
    assert result.median_batch_seconds > 0 and result.batch_size == 32
    assert result.peak_memory_bytes is None and result.device == "cpu"
    assert model.training


def test_half_width_model_is_faster():
    # ~3x fewer FLOPs; alternate rounds and keep each model's best so that load from other
    # processes on a shared machine does not decide the comparison
    kwargs = dict(input_shape=(512,), batch_size=256, warmup=2, repeats=7, device="cpu")
    full_model, half_model = mlp(2048), mlp(1024)
    full, half = [], []
    for _ in range(3):
        full.append(measure_throughput(full_model, **kwargs).images_per_second)
        half.append(measure_throughput(half_model, **kwargs).images_per_second)
    assert max(half) > 1.3 * max(full)
