import torch

from snapvit_pl.callbacks import SearchCallback
from snapvit_pl.lightning.resume import load_resume_state
from snapvit_pl.pipeline import SearchSettings, run_search

SETTINGS = dict(max_evaluations=6, popsize=3, num_images=16, batch_size=8, pca_components=4)


def test_on_train_end_runs_the_search_and_saves_every_generation(scored, module, tmp_path):
    callback = SearchCallback(SearchSettings(**SETTINGS))
    t = scored([callback])
    callback.on_train_end(t, module)
    result = module.state.search
    expected = run_search(module.backbone, t.datamodule.unlabeled_images(16), module.state.elastic_scores(),
                          SearchSettings(**SETTINGS))
    assert torch.equal(result.coefficients, expected.coefficients) and result.evaluations == 6
    assert module.state.search_settings.max_evaluations == 6 and module.state.timings.search_s > 0
    assert load_resume_state(tmp_path)["SearchCallback"]["optimizer"]["evaluations"] == 6


def test_a_resumed_search_continues_from_its_saved_generation(scored, module):
    first = SearchCallback(SearchSettings(**SETTINGS))
    t = scored([first])
    first.on_train_end(t, module)
    done = module.state.search
    resumed = SearchCallback(SearchSettings(**SETTINGS))
    resumed.load_state_dict(first.state_dict())  # the state after the last generation
    resumed.on_train_end(t, module)
    assert module.state.search.resumed_at == 6 and torch.equal(module.state.search.coefficients, done.coefficients)
