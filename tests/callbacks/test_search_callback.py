import torch

from snapvit_pl.callbacks import SearchCallback
from snapvit_pl.pipeline import PipelineSettings, SearchSettings, run_search
from snapvit_pl.run.resume import load_resume_state

SETTINGS = dict(max_evaluations=6, popsize=3, num_images=16, batch_size=8, pca_components=4)


def test_on_train_end_runs_the_search_and_saves_every_round(scored, module, tmp_path):
    module.pipeline.settings.search = SearchSettings(**SETTINGS)
    callback = SearchCallback()
    t = scored([callback])
    callback.on_train_end(t, module)
    result = module.pipeline.state.search
    expected = run_search(module.backbone, t.datamodule.unlabeled_images(16), module.pipeline._local_scores(),
                          SearchSettings(**SETTINGS))
    assert torch.equal(result.coefficients, expected.coefficients) and result.evaluations == 6
    assert module.pipeline.state.timings.search_s > 0 and module.pipeline.completed("search")
    assert load_resume_state(tmp_path)["search"]["optimizer"]["evaluations"] == 6


def test_a_resumed_search_continues_from_its_saved_generation(scored, module, tmp_path):
    module.pipeline.settings.search = SearchSettings(**SETTINGS)
    callback = SearchCallback()
    t = scored([callback])
    callback.on_train_end(t, module)
    done, saved = module.pipeline.state.search, load_resume_state(tmp_path)
    settings = module.pipeline.settings
    module.configure_pipeline(PipelineSettings(importance=settings.importance, search=settings.search), run_dir=tmp_path,
                              progress="off")
    module.pipeline.load_state_dict(saved)  # the state after the last generation
    t = scored([callback])
    callback.on_train_end(t, module)
    result = module.pipeline.state.search
    assert result.resumed_at == 6 and torch.equal(result.coefficients, done.coefficients)
