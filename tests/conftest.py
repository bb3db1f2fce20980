"""Test-wide setup. Triton's interpreter must be chosen before triton is first imported,
so this runs before any test module (and so before `kernels`) is collected."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
# Nothing is ever fetched from a model hub, in tests or anywhere else.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
