import time

import pytest
import torch

from snapvit_pl.elastic import Budget
from snapvit_pl.models import BackboneSpec, Subnet
from snapvit_pl.pipeline import ExtractedModel, RunState, SearchResult, SearchSettings, Timings
from snapvit_pl.scoring import LocalScores


def test_timings_add_up_and_skip_stages_that_did_not_run():
    timings = Timings()
    with timings.measure("evaluation"):
        time.sleep(0.01)
    timings.add("evaluation", 1.0)
    assert timings.evaluation_s > 1.0 and timings.search_s is None
    assert set(timings.to_dict()) == {"evaluation_s"}


def test_elastic_scores_carry_what_the_stages_recorded():
    state = RunState(BackboneSpec("vit_tiny_patch16_224", False), "abc", 0.1, 0.25)
    with pytest.raises(RuntimeError, match="importance"):
        state.elastic_scores()
    state.local = LocalScores([torch.ones(2)], [torch.ones(4)])
    state.scorer = {"name": "magnitude", "p": 2}
    assert state.elastic_scores().coefficients is None
    state.search_settings = SearchSettings(max_evaluations=3)
    state.search = SearchResult(torch.tensor([1.0, 2.0, 3.0]), evaluations=3, initial_fitness=0.5, best_fitness=0.4)
    scores = state.elastic_scores()
    assert torch.equal(scores.coefficients, torch.tensor([1.0, 2.0, 3.0]))
    assert scores.min_mlp_keep == 0.1 and scores.fingerprint == "abc" and scores.base["model_name"] == "vit_tiny_patch16_224"
    assert scores.settings["scorer"] == {"name": "magnitude", "p": 2} and scores.settings["search"]["max_evaluations"] == 3
    assert scores.search["improved_on_initial"] and scores.search["evaluations"] == 3


def test_extracted_model_record_is_json_ready():
    item = ExtractedModel("flops0.5", Budget(flops=0.5), Subnet.from_counts([2, 1], [8, 3]), 0.5, 0.25, 100, 2000)
    record = item.record()
    assert record["budget"] == {"flops": 0.5} and record["heads"] == [2, 1] and record["mlp_hidden"] == [8, 3]
    assert "metrics" not in record and "checkpoint" not in record
