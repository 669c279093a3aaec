"""The interpreter's builtins listed once (kvparity.kernels.interpreter_patch_cache) are the ones
Triton lists afresh before every launch: the cache changes the cost of a launch, not what runs."""

import inspect

import pytest

from kvparity.kernels import interpreter_patch_cache, runtime

pytestmark = pytest.mark.skipif(not runtime.INTERPRET, reason="compiled Triton: the interpreter is not used")


def test_the_cache_is_installed_on_this_triton():
    # Fails on a Triton whose interpreter changed shape: the cache then stays out, and runs are slower.
    assert interpreter_patch_cache.installed()


@pytest.mark.parametrize("name", ["language", "tensor", "math"])
def test_each_listing_is_what_triton_lists_outside_a_launch(name):
    import triton.language as tl

    pkg = {"language": tl, "tensor": tl.tensor, "math": tl.math}[name]
    fresh = [(n, m) for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)]
    assert fresh and interpreter_patch_cache.builtins_of(pkg) == fresh
