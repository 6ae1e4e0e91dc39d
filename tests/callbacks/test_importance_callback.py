import torch

from snapvit_pl.callbacks import ImportanceCallback
from snapvit_pl.pipeline import ImportanceSettings, PipelineSettings, local_importance
from snapvit_pl.run.resume import load_resume_state
from snapvit_pl.scoring import SSLFisher


def _run(callback, trainer, module):
    callback.setup(trainer, module, "fit")
    callback.on_train_start(trainer, module)
    for i, batch in enumerate(trainer.datamodule.train_batches()):
        if module.on_train_batch_start(batch, i) != -1:  # what the training loop does
            callback.on_train_batch_end(trainer, module, None, batch, i)
    callback.on_train_epoch_end(trainer, module)


def test_hooks_give_the_scores_of_one_pass_and_save_them_for_resume(trainer, module, tmp_path):
    module.configure_pipeline(PipelineSettings(importance=ImportanceSettings(SSLFisher(), min_mlp_keep=0.1)),
                              run_dir=tmp_path, progress="off")
    callback = ImportanceCallback()
    t = trainer([callback])
    _run(callback, t, module)
    assert t.datamodule.configured and t.datamodule.train_views == "multicrop"
    expected = local_importance(SSLFisher(), module.backbone, t.datamodule.train_batches())
    state = module.pipeline.state
    assert all(torch.equal(a, b) for a, b in zip(state.local.neurons, expected.neurons))
    assert state.method["scorer"]["name"] == "ssl_fisher" and module.pipeline.elastic_scores().min_mlp_keep == 0.1
    assert state.timings.scoring_s > 0 and module.pipeline.completed("importance")
    assert load_resume_state(tmp_path)["local"]["neurons"][0] == expected.neurons[0].tolist()


def test_a_resumed_run_skips_the_data_pass(trainer, module, tmp_path, monkeypatch):
    from snapvit_pl.pipeline.importance import ImportancePass

    first = ImportanceCallback()
    t = trainer([first])
    _run(first, t, module)
    saved, done = load_resume_state(tmp_path), module.pipeline.state.local
    module.configure_pipeline(PipelineSettings(), run_dir=tmp_path, progress="off")
    module.pipeline.load_state_dict(saved)
    seen = []
    monkeypatch.setattr(ImportancePass, "step", lambda self, batch: seen.append(batch) or {})
    t = trainer([first])
    _run(first, t, module)
    assert seen == [] and all(torch.equal(a, b) for a, b in zip(module.pipeline.state.local.heads, done.heads))


def test_the_callback_the_pipeline_and_local_importance_run_one_loop(trainer, module, tmp_path, monkeypatch):
    """One definition of the importance loop (``ImportancePass``): the callback's hooks, ``Pipeline.importance`` and
    ``local_importance`` feed the same object, pass by pass, and give the same scores (a scorer of two passes)."""
    from snapvit_pl.pipeline import Pipeline
    from snapvit_pl.pipeline.importance import ImportancePass
    from snapvit_pl.scoring import GaussNewtonGreedy

    calls = []
    step, end_pass = ImportancePass.step, ImportancePass.end_pass
    monkeypatch.setattr(ImportancePass, "step", lambda self, batch: calls.append("step") or step(self, batch))
    monkeypatch.setattr(ImportancePass, "end_pass", lambda self: calls.append("end") or end_pass(self))
    settings = PipelineSettings(importance=ImportanceSettings(GaussNewtonGreedy(probes=1, stages=2)))
    module.configure_pipeline(settings, run_dir=tmp_path / "callback", progress="off")
    t = trainer([ImportanceCallback()])
    batches = [b[:, 0] for b in t.datamodule.train_batches()]  # (the greedy reads plain images)
    t.datamodule.train_batches = lambda: batches
    callback = t.callbacks[0]
    callback.setup(t, module, "fit")
    callback.on_train_start(t, module)
    assert t.fit_loop.max_epochs == 2
    for _ in range(2):  # one epoch per pass
        for i, batch in enumerate(batches):
            callback.on_train_batch_end(t, module, None, batch, i)
        callback.on_train_epoch_end(t, module)
    one_pass = ["step"] * len(batches) + ["end"]
    assert calls == one_pass * 2
    calls.clear()
    pipeline = Pipeline(module.backbone, settings, progress="off")
    assert all(torch.equal(a, b) for a, b in zip(pipeline.importance(batches).neurons,
                                                 module.pipeline.state.local.neurons))
    assert calls == one_pass * 2
    calls.clear()
    local = local_importance(settings.importance.scorer, module.backbone, batches)
    assert calls == one_pass * 2 and all(torch.equal(a, b) for a, b in zip(local.neurons, pipeline.state.local.neurons))
