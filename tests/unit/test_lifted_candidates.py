"""Real SGLang's own functions as candidates (``--candidate sglang:BACKEND``): lifted unchanged from
an installed release at check time, they get parity; the same lifted file with one character
changed does not (the check can fail)."""

from __future__ import annotations

import pytest

from kvparity.candidate.lift import lift, lifted_names


def test_a_lifted_function_brings_the_functions_of_its_module_it_calls():
    text = "def kernel():\n    pass\n\n\ndef helper():\n    kernel()\n\n\ndef main():\n    helper()\n\n\ndef other():\n    pass\n"
    assert lifted_names(text, "main") == {"main", "helper", "kernel"}
    assert lifted_names(text, "missing") == set()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_sglangs_own_get_last_loc_gets_parity_and_a_changed_copy_does_not(tmp_path, backend):
    from kvparity.candidate.check import check_candidate

    spec = lift(f"sglang:{backend}", "get_last_loc", tmp_path)
    assert check_candidate("get_last_loc", spec, 10, 0).verdict == "parity"
    path, _, name = spec.rpartition(":")
    text = open(path).read()
    broken = text.replace("prefix_lens_tensor - 1", "prefix_lens_tensor - 2").replace("(prefix_lens - 1)", "(prefix_lens - 2)")
    assert broken != text
    (tmp_path / "broken.py").write_text(broken)
    assert check_candidate("get_last_loc", f"{tmp_path / 'broken.py'}:{name}", 10, 0).verdict == "divergence"


def test_a_backend_or_target_without_a_lift_is_a_load_error(tmp_path):
    from kvparity.candidate.loader import CandidateLoadError

    with pytest.raises(CandidateLoadError, match="lifted for backends triton, torch"):
        lift("sglang:cuda", "get_last_loc", tmp_path)
