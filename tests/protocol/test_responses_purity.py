"""`protocol` imports nothing of ignis, sanic, torch or asyncio."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import protocol

FORBIDDEN = ("ignis", "sanic", "torch", "asyncio", "ignis_kernels", "triton", "numpy")


def test_protocol_imports_no_runtime():
    modules = sorted(f"protocol.{m.name}" for m in pkgutil.iter_modules(protocol.__path__))
    assert "protocol.stream" in modules and "protocol.decode" in modules
    root = Path(protocol.__file__).resolve().parent.parent
    code = (
        "import importlib, json, sys\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(n for n in sys.modules if n.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
