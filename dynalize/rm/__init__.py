"""Reward-model retraining: preference pairs from a run's discovered hacks, and Bradley–Terry
training of a sequence-classification RM on them (`python -m dynalize.rm pairs | train`).

`config` holds the settings, `pairfile` the pair-file format, `pairs` builds pairs from a run,
`train` trains and evaluates an RM; docs/rm_retraining.md has the recipe.
"""
