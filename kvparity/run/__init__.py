"""Scenarios played and judged end to end: the lockstep over several worlds (``runner``), the
parallel sweep over templates and shards, shrinking, replay, and the release matrix."""
