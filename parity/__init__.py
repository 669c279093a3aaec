"""The parity harness (scenarios, runner, comparison, report)."""
