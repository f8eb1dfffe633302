"""Replay tooling: re-run one logged step of a finished run as the services ran it.

``dart replay decision`` re-samples a rollout worker's logged decision and ``dart replay update``
re-applies a trainer update from the checkpoint before it (:mod:`dart.replay.steps`). A debugging
tool over the log, not part of the composition root: it imports the engine and the trainer the way
the services do, and nothing imports it but the CLI.
"""
