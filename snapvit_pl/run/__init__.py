"""A pruning run's folder and what makes a run a run: the names of its files (:mod:`.names`), the lock that gives
the folder one writer (:mod:`.lock`), the folder's policy (:mod:`.folder`: refused, overwritten, held, given up),
the progress an interrupted run resumes from (:mod:`.resume`) and the images a finished run read, taken back for
later cuts (:mod:`.data`). ``prune.py``, :class:`snapvit_pl.pipeline.Pipeline` and a composed Trainer
(:class:`snapvit_pl.lightning.pruning_module.PruningModule`) share it.

:mod:`.names`, :mod:`.lock` and :mod:`.folder`'s check import no torch: ``prune.py`` checks a folder before
anything heavy is imported. Nothing here is imported by this file.
"""
