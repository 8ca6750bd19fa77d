"""Parse the project's own source files for the tests that read its syntax."""

from __future__ import annotations

import ast
import gc
from pathlib import Path


def parse(path: Path) -> ast.Module:
    """``path``'s syntax tree.

    Python 3.11 keeps the AST builder's recursion count in one state shared by every
    thread, so a parse that a collection interrupts (its finalizers run Python code, and
    another thread may parse meanwhile) can fail with ``SystemError: AST constructor
    recursion depth mismatch`` (CPython gh-106905). With collection off, nothing runs
    Python code during this parse, so no other thread can run in the middle of it.
    """
    source = path.read_text()
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, str(path))
    finally:
        if enabled:
            gc.enable()
