"""Golden files: hand-picked scenarios recorded through the lockstep, stored as JSON, checked."""
