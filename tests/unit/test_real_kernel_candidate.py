"""SGLang calls its plug-in targets positionally (SPEC 9), so kvparity checks a candidate's number
and kind of parameters, not their names: the real ``alloc_extend_kernel`` of SGLang 0.5.3.post2
(first parameter ``pre_lens_ptr``), lifted unchanged from its wheel into a file of its own, gets
parity. (It is read from the installed release at test time; nothing of it is stored here.)"""

from __future__ import annotations

import ast
from pathlib import Path

from kvparity.cli.main import main
from kvparity.engine.real.install import resolve


def _lift(source_file: Path, name: str, dest: Path) -> Path:
    """The function ``name`` of ``source_file``, decorators included, alone in ``dest``."""
    text = source_file.read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    decorators = "".join(f"@{ast.get_source_segment(text, d)}\n" for d in node.decorator_list)
    dest.write_text("import triton\nimport triton.language as tl\n\n\n" + decorators + ast.get_source_segment(text, node) + "\n")
    return dest


def test_the_real_alloc_extend_kernel_of_0_5_3_post2_gets_parity(tmp_path, capsys):
    allocator = Path(resolve("0.5.3.post2").path) / "sglang/srt/mem_cache/allocator.py"
    lifted = _lift(allocator, "alloc_extend_kernel", tmp_path / "real_alloc_extend.py")
    assert "pre_lens_ptr" in lifted.read_text()
    status = main(["check", "--target", "alloc_extend", "--candidate", f"{lifted}:alloc_extend_kernel", "--examples", "40"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "PARITY" in printed
