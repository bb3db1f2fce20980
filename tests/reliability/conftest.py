"""The reliability tests' helpers on sys.path. The tiny model and the servers over it
(`srv`, `start_server`) are the session fixtures of tests/conftest.py."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for extra in (HERE, HERE.parent / "server", HERE.parent / "model", HERE.parent / "protocol"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))
