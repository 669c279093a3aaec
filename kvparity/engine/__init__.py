"""Playing a scenario: worlds, the scheduler loop, snapshots, the lockstep over several worlds, the
parallel sweep over templates, shrinking and replay, and real SGLang in worker processes."""
