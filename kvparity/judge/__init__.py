"""Judging what was played: comparison of worlds (exact, or up to renumbering), the oracles, exact
tensor equality, and the one differ that finds and names differing cells."""
