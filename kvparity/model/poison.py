"""The sentinel written into every table before a run, so a cell nobody should write, or one
somebody forgot to write, shows. Negative, so it can never be mistaken for a KV slot."""

POISON = -12345
