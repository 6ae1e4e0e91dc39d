import pytest
import torch

from families import FAMILIES, random_elastic_scores
from snapvit_pl.elastic import Budget, CostModel
from snapvit_pl.elastic import latency as latency_module
from snapvit_pl.elastic.latency import BlockLatency, LatencyTable, latency_table, measure_latency_table, mlp_widths
from snapvit_pl.errors import PruningSpecError
from snapvit_pl.models import Subnet, architecture, load_backbone


def test_noisy_timings_become_non_decreasing_and_widths_interpolate():
    block = BlockLatency({1: 6.0, 2: 5.0, 3: 7.0, 4: 8.0}, {1: 1.0, 64: 2.0, 128: 4.0, 256: 8.0})
    assert list(block.heads_ms.values()) == [5.5, 5.5, 7.0, 8.0]  # pooled, not the running maximum
    assert block.dense_ms == 8.0 and block.predict(2, 96) == pytest.approx(5.5 + 3.0 - 8.0)
    assert block.predict(4, 256) == block.dense_ms
    assert mlp_widths(256, 4) == [1, 64, 128, 192, 256] and mlp_widths(256, 4, multiple=48) == [1, 48, 144, 192, 240, 256]


def _table(model, overhead=5.0):
    """A synthetic table: 1 ms per head, 0.01 ms per neuron, per block."""
    arch = architecture(model)
    heads, width = arch["heads"][0], arch["mlp_hidden"][0]
    shape = BlockLatency({h: float(h + width * 0.01) for h in range(1, heads + 1)},
                         {n: float(heads + n * 0.01) for n in mlp_widths(width)})
    blocks = len(arch["heads"])
    return LatencyTable("cpu", "cpu", 8, "auto", arch, overhead, overhead + blocks * shape.dense_ms, [shape], [0] * blocks)


def test_a_latency_budget_is_met_on_the_table_within_one_unit():
    model = load_backbone(FAMILIES["dino_vit"])
    scores, table = random_elastic_scores(model), _table(model)
    assert table.predict(Subnet.full(model)) == pytest.approx(table.dense_ms)
    cost = CostModel(model, latency=table)
    for target in (0.8 * table.dense_ms, 0.6 * table.dense_ms):
        subnet, _, _ = scores.subnet(Budget(latency=target), cost)
        achieved = table.predict(subnet)
        assert achieved <= target and target - achieved <= _largest_step(table) + 1e-9
    with pytest.raises(PruningSpecError, match="latency budgets need a latency table"):
        scores.subnet(Budget(latency=1.0), CostModel(model))
    with pytest.raises(PruningSpecError, match="unreachable"):
        scores.subnet(Budget(latency=1.0), cost)


def test_the_table_is_measured_once_and_reused_from_its_cache(tmp_path, monkeypatch):
    model = load_backbone(FAMILIES["dino_vit"])
    calls = []
    real = latency_module.measure_latency_table
    monkeypatch.setattr(latency_module, "measure_latency_table",
                        lambda *a, **k: calls.append(a[1]) or real(*a, **{**k, "repeats": 2, "warmup": 1}))
    cache = tmp_path / "latency_table.json"
    first = latency_table(model, 4, "cpu", cache)
    again = latency_table(model, 4, "cpu", cache)
    assert calls == [4] and again == first and LatencyTable.load(cache) == first
    latency_table(model, 8, "cpu", cache)  # another batch size: measured again
    assert calls == [4, 8]


def test_measured_table_covers_every_head_count_and_predicts_the_dense_model():
    model = load_backbone(FAMILIES["eva02_fused_qkv"])  # rope: blocks need their keyword arguments
    table = measure_latency_table(model, batch_size=2, device="cpu", mlp_points=3, warmup=1, repeats=3)
    assert sorted(table.shapes[0].heads_ms) == [1, 2, 3, 4] and table.block_shape == [0, 0]
    assert table.dense_ms > 0 and table.overhead_ms >= 0 and all(v > 0 for v in table.shapes[0].mlp_ms.values())
    assert table.predict(Subnet.full(model)) == pytest.approx(max(table.dense_ms, table.overhead_ms + 2 * table.shapes[0].dense_ms))
    assert torch.isfinite(torch.tensor(table.predict(Subnet.from_counts([1, 2], [3, 40]))))


def _largest_step(table: LatencyTable) -> float:
    """The largest latency step of one head or one sampled MLP width: the resolution a budget is met with."""
    steps = [0.0]
    for shape in table.shapes:
        for measured in (shape.heads_ms, shape.mlp_ms):
            keys = sorted(measured)
            steps += [measured[b] - measured[a] for a, b in zip(keys, keys[1:])]
    return max(steps)


def test_an_edited_or_damaged_table_is_refused(tmp_path):
    import json

    from snapvit_pl.errors import CheckpointError

    path = tmp_path / "latency_table.json"
    table = _table(load_backbone(FAMILIES["dino_vit"]))
    table.save(path)
    assert LatencyTable.load(path) == table
    data = json.loads(path.read_text())
    data["overhead_ms"] = data["overhead_ms"] / 2  # still a valid table, but not what was measured
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="does not match its checksum.*delete it to measure again"):
        LatencyTable.load(path)
    del data["sha256"]
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="carries no checksum"):
        LatencyTable.load(path)


def test_a_block_is_never_predicted_below_zero():
    """Noise can make the two savings, measured apart, exceed the block's own time: the prediction stays >= 0."""
    block = BlockLatency({1: 0.1, 2: 5.0}, {1: 0.1, 8: 5.0})
    assert block.predict(1, 1) == 0.0 and block.predict(2, 8) == pytest.approx(5.0)


def test_a_downgraded_or_crafted_table_is_refused_by_its_schema(tmp_path):
    """Without its version (or with an older one) nothing else is read; re-signed with an impossible field, the
    schema names the field: no table with a head count it cannot predict, or a negative time, is used."""
    import json

    from snapvit_pl.errors import CheckpointError
    from snapvit_pl.io import with_checksum

    path = tmp_path / "latency_table.json"
    _table(load_backbone(FAMILIES["dino_vit"])).save(path)
    genuine = json.loads(path.read_text())
    genuine.pop("sha256")
    for version in (None, 0):
        data = {k: v for k, v in genuine.items() if k != "version"} | ({} if version is None else {"version": version})
        path.write_text(json.dumps(data))
        with pytest.raises(CheckpointError, match="reads version 1 only"):
            LatencyTable.load(path)
    heads = genuine["shapes"][0]["heads_ms"]
    for field, value, named in (("dense_ms", -1.0, "dense_ms"), ("batch_size", "8", "batch_size"),
                                ("block_shape", [0] * 99, "block_shape"),
                                ("shapes", [{"heads_ms": {k: v for k, v in list(heads.items())[1:]},
                                             "mlp_ms": genuine["shapes"][0]["mlp_ms"]}], "shapes.0.heads_ms")):
        path.write_text(json.dumps(with_checksum({**genuine, field: value})))
        with pytest.raises(CheckpointError, match=rf"{named} is .* expected"):
            LatencyTable.load(path)
