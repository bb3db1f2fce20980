"""Shared, cached test material for the tokenizer and chat-template tests: the embedded
SmolLM2 GGUF read once (2-3 s), transformers' tokenizer for it (the oracle), and a writer of
tiny GGUF files holding the vocabulary of tests/model/tiny_models.py's tokenizer."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

# A unicode-heavy sample: accents, emoji (multi-codepoint ZWJ sequences, flags), CJK, Arabic,
# digits, whitespace runs, tabs, CRLF, code.
TEXTS = [
    "Hello, world!",
    "12345 3.14159",
    "1,000,000 and 2024-06-01T12:30:00Z",
    "héllo wörld — ñandú, Ærøskøbing, naïve café",
    "emoji 🤗🎉 family 👩‍👩‍👧 flag 🇫🇷 skin 👍🏽",
    "中文测试，日本語のテキスト、한국어 텍스트",
    "مرحبا بالعالم",
    "tabs\tand\nnewlines\n\n  indented\r\n\r\nend",
    "a   b    c     d",
    "   leading and trailing   ",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "I'm sure they'll've done it; DON'T",
    "",
]


@lru_cache(maxsize=1)
def smollm2_path() -> Path:
    from ignis.model.embedded import smollm2_gguf_path

    return smollm2_gguf_path()


@lru_cache(maxsize=1)
def smollm2_reader() -> Any:
    import gguf

    return gguf.GGUFReader(smollm2_path())


@lru_cache(maxsize=1)
def smollm2_tokenizer() -> Any:
    from ignis.model.tokenizer import Tokenizer

    return Tokenizer.from_gguf(smollm2_reader())


@lru_cache(maxsize=1)
def smollm2_template() -> Any:
    from ignis.model.chat_template import ChatTemplate

    return ChatTemplate.from_gguf(smollm2_reader())


@lru_cache(maxsize=1)
def smollm2_transformers() -> Any:
    """transformers' tokenizer for the same GGUF file."""
    from transformers import AutoTokenizer

    path = smollm2_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@lru_cache(maxsize=1)
def smollm2_original_pipeline() -> Any:
    """transformers' vocabulary and merges for the GGUF, split the way SmolLM2's own
    tokenizer.json splits: Sequence[Digits(individual_digits=True), ByteLevel(regex)].
    transformers' GGUF converter has no entry for `tokenizer.ggml.pre == "smollm"` and keeps
    GPT-2's split, which differs on whitespace before a digit."""
    from tokenizers import Tokenizer as Pipeline
    from tokenizers import pre_tokenizers

    pipeline = Pipeline.from_str(smollm2_transformers().backend_tokenizer.to_str())
    pipeline.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return pipeline


def write_tiny_gguf(tokenizer_dir: Path, out_dir: Path, *, pre: str, add_bos: bool | None = None) -> Path:
    """A tensor-less GGUF whose tokenizer metadata holds the vocabulary and merges of the
    tokenizer.json in `tokenizer_dir` (special tokens as CONTROL, other added ones as
    USER_DEFINED), in a directory of its own so transformers reads the GGUF, not the json."""
    import gguf

    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = spec["model"]["vocab"]
    added = {t["id"]: t for t in spec["added_tokens"]}
    size = max(max(vocab.values()), max(added)) + 1
    tokens = [""] * size
    types = [1] * size
    for token, token_id in vocab.items():
        tokens[token_id] = token
    for token_id, token in added.items():
        tokens[token_id] = token["content"]
        types[token_id] = 3 if token["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"tiny-{pre}.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
