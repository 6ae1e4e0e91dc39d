import time


from snapvit_pl.elastic import Budget
from snapvit_pl.models import BackboneSpec, Subnet
from snapvit_pl.pipeline import ExtractedModel, Timings


def test_timings_add_up_and_skip_stages_that_did_not_run():
    timings = Timings()
    with timings.measure("evaluation"):
        time.sleep(0.01)
    timings.add("evaluation", 1.0)
    assert timings.evaluation_s > 1.0 and timings.search_s is None
    assert set(timings.to_dict()) == {"evaluation_s"}


def test_extracted_model_record_is_json_ready():
    item = ExtractedModel("flops0.5", Budget(flops=0.5), Subnet.from_counts([2, 1], [8, 3]), 0.5, 0.25, 100, 2000)
    record = item.record()
    assert record["budget"] == {"flops": 0.5} and record["heads"] == [2, 1] and record["mlp_hidden"] == [8, 3]
    assert "metrics" not in record and "checkpoint" not in record
