"""Reporting a failure: what diverged, where, and the scenario to replay it."""
