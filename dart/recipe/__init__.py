"""The learning recipe in one process: its knobs (:mod:`dart.recipe.config`), the warm start
(:mod:`dart.recipe.warmstart`), episodes and held-out evaluation with an in-process engine
(:mod:`dart.recipe.episodes`), and the one-process learner (:mod:`dart.recipe.learn`).
Re-running a logged decision or update is replay tooling: :mod:`dart.replay.steps`.

Like ``dart.stack`` it sits above the services and calls their code in process; ``dart.stack``
composes the services as processes and uses this package for the warm start and evaluation.
"""
