"""Rubric rewards: weighted criteria a judge checks (`criteria`), Rubric Dropout's keep-masks
(`dropout`), POW3R-style criterion reweighting (`reweight`) and the proxy/gold measurement
(`protocol`). Their settings are in `config`; `dynalize.rewards.RubricTerm` joins them into a
reward term.

Pure logic: nothing here imports an engine. Import from the submodules (this package file
imports nothing, so reading the settings loads no runtime code).
"""
