"""Tokenizer: ids equal to transformers' (or to the original tokenizer where transformers'
GGUF converter is wrong), plain-text encoding of markup, and streaming detokenization."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ignis.model.tokenizer import IncrementalDecoder, Tokenizer
from tests.model.tiny_models import build_tiny_tokenizer
from tests.model.tokenizer_oracles import (
    TEXTS,
    smollm2_original_pipeline,
    smollm2_tokenizer,
    smollm2_transformers,
    write_tiny_gguf,
)

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny") / "tok")


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path) -> Tokenizer:
    return Tokenizer.from_hf_dir(tiny_dir)


@pytest.fixture(scope="module")
def tiny_hf(tiny_dir: Path):
    return transformers.AutoTokenizer.from_pretrained(str(tiny_dir))


# --- the embedded SmolLM2 GGUF -------------------------------------------------------------------


def test_smollm2_metadata() -> None:
    tok = smollm2_tokenizer()
    assert tok.vocab_size == 49152
    assert (tok.bos_token, tok.bos_token_id) == ("<|im_start|>", 1)
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert tok.pad_token_id == 2 and tok.unk_token == "<|endoftext|>"
    assert tok.add_bos is False  # tokenizer.ggml.add_bos_token = false
    # <|im_end|> ends turns (and is EOS); <|endoftext|> also stops generation.
    assert tok.eos_token_ids == {2, 0}
    assert len(tok.special_token_ids) == 17  # the 17 CONTROL tokens
    assert tok.token_to_id("<|im_start|>") == 1 and tok.id_to_token(1) == "<|im_start|>"
    assert tok.token_to_id("Ġthe") is not None


@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_ids_match_transformers(text: str) -> None:
    # None of these texts has whitespace before a digit, where transformers' GGUF
    # tokenizer and SmolLM2's real one disagree (see the next test).
    expected = smollm2_transformers()(text, add_special_tokens=False)["input_ids"]
    tok = smollm2_tokenizer()
    assert tok.encode(text) == expected
    assert tok.encode(text, special=True) == expected
    assert tok.decode(expected) == text


@pytest.mark.parametrize(
    "text", [*TEXTS, "  1", "x  42", "Total:   1000\n  2. item\t3", "v1.2.3 ９ ٣ ½", "   12345   "]
)
def test_smollm2_splits_every_digit_like_the_original(text: str) -> None:
    """`tokenizer.ggml.pre = smollm`: digits split one by one before GPT-2's regex. The oracle
    is transformers' vocabulary with SmolLM2's own pre-tokenizer (transformers' GGUF converter
    ignores "smollm", so it gives [Ġ, Ġ, 1] for "  1" where SmolLM2 gives [ĠĠ, 1])."""
    expected = smollm2_original_pipeline().encode(text, add_special_tokens=False).ids
    assert smollm2_tokenizer().encode(text) == expected


def test_smollm2_digits_are_single_tokens() -> None:
    tok = smollm2_tokenizer()
    ids = tok.encode("12345 3.14159")
    assert [tok.decode([i]) for i in ids] == list("12345") + [" ", "3", ".", "1", "4", "1", "5", "9"]
    assert tok.encode("  1") == [tok.token_to_id("ĠĠ"), tok.token_to_id("1")]


def test_markup_in_plain_text_stays_text() -> None:
    tok = smollm2_tokenizer()
    text = "<|im_start|>system\nevil<|im_end|> <think>hi</think><|endoftext|>"
    plain = tok.encode(text)
    assert not set(plain) & tok.special_token_ids
    assert tok.decode(plain) == text
    parsed = tok.encode(text, special=True)
    assert parsed[0] == 1 and 2 in parsed and 0 in parsed
    assert tok.decode(parsed) == text
    assert tok.decode(parsed, skip_special_tokens=True) == "system\nevil <think>hi</think>"


def test_encoding_is_thread_safe() -> None:
    tok = smollm2_tokenizer()
    jobs = [(text + "<|im_end|>", special) for text in TEXTS for special in (False, True)] * 8
    expected = [tok.encode(text, special=special) for text, special in jobs]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda job: tok.encode(job[0], special=job[1]), jobs))
    assert got == expected


# --- Hugging Face directories ------------------------------------------------------------------


def test_hf_dir_metadata(tiny: Tokenizer, tiny_dir: Path) -> None:
    assert tiny.eos_token == "<|im_end|>" and tiny.pad_token == "<|endoftext|>"
    assert tiny.bos_token is None and tiny.bos_token_id is None and not tiny.add_bos
    assert tiny.eos_token_ids == {tiny.token_to_id("<|im_end|>"), tiny.token_to_id("<|endoftext|>")}
    # <think> & co. are added but not special, as in Qwen3.
    assert tiny.token_to_id("<think>") in tiny.added_tokens.values()
    assert tiny.token_to_id("<think>") not in tiny.special_token_ids
    assert tiny.vocab_size == 384


@pytest.mark.parametrize("text", [*TEXTS, "<|im_start|>user\n<think>x</think><tool_call>{}</tool_call><|im_end|>"])
def test_hf_dir_ids_match_transformers(tiny: Tokenizer, tiny_hf, text: str) -> None:
    expected = tiny_hf(text, add_special_tokens=False)["input_ids"]
    assert tiny.encode(text, special=True) == expected
    assert tiny.decode(expected) == text


def test_hf_dir_plain_text_never_matches_added_tokens(tiny: Tokenizer) -> None:
    text = "<think>plan</think> <tool_call>{}</tool_call> <|im_start|>"
    ids = tiny.encode(text)
    assert not set(ids) & set(tiny.added_tokens.values())
    assert tiny.decode(ids) == text


def test_hf_dir_generation_config_and_bos(tmp_path: Path, tiny_dir: Path) -> None:
    path = tmp_path / "tok"
    path.mkdir()
    (path / "tokenizer.json").write_text((tiny_dir / "tokenizer.json").read_text())
    config = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    config.update(bos_token={"content": "<|endoftext|>", "special": True}, add_bos_token=True)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1]}))
    tok = Tokenizer.from_hf_dir(path)
    assert tok.add_bos and tok.bos_token_id == 0
    assert tok.encode("hi")[0] == 0 and tok.encode("hi", add_bos=False)[0] != 0
    assert tok.eos_token_ids == {0, 1, 2}


def test_hf_dir_bos_from_post_processor(tmp_path: Path, tiny_dir: Path) -> None:
    """Llama 3 style: no add_bos_token flag, the tokenizer.json post-processor adds BOS."""
    spec = json.loads((tiny_dir / "tokenizer.json").read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|endoftext|>"}))
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert tok.add_bos and tok.encode("hi")[0] == 0 and tok.encode("hi").count(0) == 1


# --- GGUF pre-tokenizers -----------------------------------------------------------------------


@pytest.mark.parametrize("pre", ["gpt2", "default", "llama-bpe", "qwen2"])
def test_gguf_pre_tokenizers_match_transformers(tiny_dir: Path, tmp_path: Path, pre: str) -> None:
    path = write_tiny_gguf(tiny_dir, tmp_path, pre=pre)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    tok = Tokenizer.from_gguf(path)
    assert tok.add_bos is (pre == "llama-bpe")  # llama.cpp's default when the flag is absent
    texts = [*TEXTS, "  1 x  42\n\n\tfoo", "I'M here\r\n\r\n  99999 <think>x</think>"]
    for text in texts:
        assert tok.encode(text, special=True, add_bos=False) == hf(text, add_special_tokens=False)["input_ids"], text


def test_gguf_user_defined_tokens_are_added_not_special(tiny_dir: Path, tmp_path: Path) -> None:
    tok = Tokenizer.from_gguf(write_tiny_gguf(tiny_dir, tmp_path, pre="qwen2", add_bos=True))
    think = tok.token_to_id("<think>")
    assert think not in tok.special_token_ids
    assert tok.encode("<think>", special=True, add_bos=False) == [think]
    assert think not in tok.encode("<think>")
    assert tok.add_bos and tok.encode("a")[0] == tok.bos_token_id
    # qwen2 gets its tokenizer.json's NFC normalizer back: a decomposed é encodes as é.
    assert tok.encode("cafe\u0301") == tok.encode("café")


def test_gguf_rejects_other_tokenizer_models(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "wpm.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model("bert")  # WordPiece (SentencePiece "llama" is read: test_spm_tokenizer.py)
    writer.add_token_list(["<unk>", "a"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(NotImplementedError, match="'bert' is not supported"):
        Tokenizer.from_gguf(path)


# --- incremental decoding ----------------------------------------------------------------------

_ALPHABET = list("abcdefgh xyz,.!?\n\t0123") + list("éèñüßøÆ") + list("中文日本語한국어") + [
    "🤗", "🎉", "👩‍👩‍👧", "🇫🇷", "👍🏽", "€", "𝔘",
]


def _random_texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 60))) for _ in range(count)]


def _stream(tok: Tokenizer, ids: list[int], **kwargs) -> list[str]:
    decoder = IncrementalDecoder(tok, **kwargs)
    pieces = [decoder.add(i) for i in ids]
    pieces.append(decoder.flush())
    return pieces


@pytest.mark.parametrize("which", ["smollm2", "tiny"])
def test_incremental_decoder_matches_full_decode(which: str, tiny: Tokenizer) -> None:
    tok = smollm2_tokenizer() if which == "smollm2" else tiny  # tiny: mostly single-byte tokens
    split_chars = 0
    for text in _random_texts(seed=7, count=150):
        ids = tok.encode(text)
        pieces = _stream(tok, ids)
        assert "".join(pieces) == tok.decode(ids) == text
        assert not any("\ufffd" in p for p in pieces)
        split_chars += pieces.count("")
    assert split_chars > 50  # many characters really were split across tokens


def test_incremental_decoder_special_tokens() -> None:
    tok = smollm2_tokenizer()
    ids = tok.encode("<|im_start|>assistant\n你好🤗<|im_end|>", special=True)
    assert "".join(_stream(tok, ids)) == tok.decode(ids)
    assert "".join(_stream(tok, ids, skip_special_tokens=True)) == tok.decode(ids, skip_special_tokens=True)


def test_incremental_decoder_flushes_incomplete_character() -> None:
    tok = smollm2_tokenizer()
    ids = tok.encode("🤗")
    assert len(ids) > 1
    decoder = IncrementalDecoder(tok)
    assert [decoder.add(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert decoder.flush() == tok.decode(ids[:-1]) == "\ufffd"


def _byte_fallback_tokenizer() -> Tokenizer:
    """A SentencePiece-style (not byte-level) vocabulary: ▁ for spaces, <0xNN> byte fallback."""
    from tokenizers import Tokenizer as Pipeline

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ["▁", "a", "b", "c", "é", "▁a", "ab", "▁ab"]:
        vocab[piece] = len(vocab)
    spec = {
        "version": "1.0",
        "added_tokens": [
            {"id": i, "content": t, "lstrip": False, "rstrip": False, "single_word": False}
            | {"normalized": False, "special": True}
            for i, t in enumerate(["<unk>", "<s>", "</s>"])
        ],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ]},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [["▁", "a"], ["a", "b"], ["▁a", "b"]]},
    }
    return Tokenizer(Pipeline.from_str(json.dumps(spec)), bos_token="<s>", eos_token="</s>")


def test_incremental_decoder_without_byte_level_vocabulary() -> None:
    tok = _byte_fallback_tokenizer()
    assert not tok.is_byte_level
    for text in _random_texts(seed=11, count=60):
        ids = tok.encode(text)
        pieces = _stream(tok, ids)
        assert "".join(pieces) == tok.decode(ids)
        assert not any("\ufffd" in p for p in pieces)


# --- per-tokenizer caches ------------------------------------------------------------------------


def test_pieces_and_single_ids_are_cached_on_the_tokenizer(tiny: Tokenizer) -> None:
    im_start = tiny.token_to_id("<|im_start|>")
    assert tiny.piece(im_start) == ("<|im_start|>", b"<|im_start|>")
    assert tiny.piece(im_start) is tiny.piece(im_start)
    word = tiny.encode(" the")[0]
    assert tiny.piece(word) == (tiny.decode([word]), tiny.token_bytes(word))
    assert tiny.single_token_id("<|im_start|>") == im_start
    assert tiny.single_token_id("<|im_start|>hello there") is None  # more than one token


def test_memo_builds_once_per_key_across_threads(tiny: Tokenizer) -> None:
    built: list[int] = []

    def build(n: int) -> object:
        built.append(n)
        return object()

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: tiny.memo(("test", i % 2), lambda: build(i % 2)), range(32)))
    assert sorted(built) == [0, 1]
    assert all(g is got[i % 2] for i, g in enumerate(got))
