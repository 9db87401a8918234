"""Hack discovery for any RL run (`python -m dynalize.monitor`): readers of other frameworks'
rollout logs, a replay of Dynalize's penalty term over them, and the summary it prints."""
