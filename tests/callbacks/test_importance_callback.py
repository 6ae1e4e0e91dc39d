import torch

from snapvit_pl.callbacks import ImportanceCallback
from snapvit_pl.lightning.resume import load_resume_state
from snapvit_pl.pipeline import ImportanceSettings, local_importance
from snapvit_pl.scoring import SSLFisher


def _run(callback, trainer, module):
    callback.setup(trainer, module, "fit")
    callback.on_train_start(trainer, module)
    for i, batch in enumerate(trainer.datamodule.train_batches()):
        callback.on_train_batch_end(trainer, module, None, batch, i)
    callback.on_train_epoch_end(trainer, module)


def test_hooks_give_the_scores_of_one_pass_and_save_them_for_resume(trainer, module, tmp_path):
    callback = ImportanceCallback(ImportanceSettings(SSLFisher(), min_mlp_keep=0.1))
    t = trainer([callback])
    _run(callback, t, module)
    assert t.datamodule.configured and t.datamodule.train_views == "multicrop"
    expected = local_importance(SSLFisher(), module.backbone, t.datamodule.train_batches())
    assert all(torch.equal(a, b) for a, b in zip(module.state.local.neurons, expected.neurons))
    assert module.state.scorer["name"] == "ssl_fisher" and module.state.min_mlp_keep == 0.1
    assert module.state.timings.scoring_s > 0
    saved = load_resume_state(tmp_path)["ImportanceCallback"]
    assert saved["local_scores"]["neurons"][0] == expected.neurons[0].tolist()


def test_a_resumed_run_skips_the_data_pass(trainer, module):
    first = ImportanceCallback()
    t = trainer([first])
    _run(first, t, module)
    resumed = ImportanceCallback()
    resumed.load_state_dict(first.state_dict())
    seen = []
    resumed.settings.scorer.update = lambda batch: seen.append(batch) or {}
    module.state.local = None
    _run(resumed, t, module)
    assert seen == [] and module.state.local is not None
    assert all(torch.equal(a, b) for a, b in zip(module.state.local.heads, first._local.heads))
