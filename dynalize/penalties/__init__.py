"""Evolving penalties: a proposer writes negative rubrics (`proposer`, `lexical`), a buffer keeps
the live ones (`buffer`), a judge checks every rollout against them (`judge`). Their settings are
in `config`; `dynalize.rewards.PenaltyTerm` joins the three into a reward term.

Import from the submodules (this package file imports nothing, so reading the settings loads no
runtime code).
"""
