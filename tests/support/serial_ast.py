"""Run a module (`python -m tests.support.serial_ast MODULE ARGS...`) with `ast.parse`
serialized across its threads.

CPython 3.11's AST constructor keeps one recursion counter per interpreter, so two threads
parsing at once can fail with "SystemError: AST constructor recursion depth mismatch"
(python/cpython#106905). Schemathesis's workers are threads, and Hypothesis describes its
strategies' lambdas by parsing their source: with two workers that failed one run in two here.
"""

from __future__ import annotations

import ast
import runpy
import sys
import threading
from typing import Any

_LOCK = threading.Lock()
_PARSE = ast.parse


def _parse(*args: Any, **kwargs: Any) -> Any:
    with _LOCK:
        return _PARSE(*args, **kwargs)


if __name__ == "__main__":
    ast.parse = _parse
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
