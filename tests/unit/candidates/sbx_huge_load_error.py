"""SANDBOX: its module raises, while being loaded, an exception whose message is one 4 MB line."""

raise RuntimeError("HUGE-LOAD-START" + "z" * (4 * 1024 * 1024) + "HUGE-LOAD-END")
