"""SentencePiece vocabularies from GGUF metadata (tokenizer.ggml.model "llama": Gemma,
Llama 2, Phi-3) against SentencePiece itself and transformers' reading of the same file.

A tiny SentencePiece BPE model (byte fallback, Gemma's special ids, user-defined turn
markers) is trained here; its pieces, scores and types go into a GGUF as llama.cpp's
converter writes them (`_create_vocab_sentencepiece`: control, user-defined, byte, unused,
unknown). Both shapes are checked: Gemma's (no space prefix, merges in file order) and
Llama 2's (a "▁" before the text).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from ignis.model.tokenizer import IncrementalDecoder, Tokenizer
from tests.model.tiny_models import SPM_TEXTS, SPM_USER_DEFINED, build_tiny_spm

TEXTS = SPM_TEXTS + [
    "",
    " leading space",
    "two  spaces and   three, trailing ",
    "\n\nnewlines\n\n\nand tabs\t\t!",
    "unseen characters: ∑ ∫ ж ⊕ and a 🦀",
    "<start_of_turn>user\nHi<end_of_turn>",  # user-defined pieces: matched whole in plain text
    "Pack my box with five dozen liquor jugs" * 3,
]


def _write_vocab_gguf(model: Path, out: Path, arch: str, space_prefix: bool) -> Path:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(
            gguf.TokenType.UNKNOWN if sp.is_unknown(i)
            else gguf.TokenType.CONTROL if sp.is_control(i)
            else gguf.TokenType.UNUSED if sp.is_unused(i)
            else gguf.TokenType.BYTE if sp.is_byte(i)
            # what the converter marks user-defined from tokenizer_config.json's added tokens
            else gguf.TokenType.USER_DEFINED if sp.id_to_piece(i) in SPM_USER_DEFINED
            else gguf.TokenType.NORMAL
        )
    w = gguf.GGUFWriter(str(out), arch)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module", params=[("gemma3", False), ("llama", True)], ids=["gemma", "llama2"])
def vocab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    import sentencepiece as spm

    arch, prefix = request.param
    root = tmp_path_factory.mktemp(arch)
    model = build_tiny_spm(root, dummy_prefix=prefix)
    (root / "gguf").mkdir()  # alone: transformers would read the tokenizer.model beside it
    path = _write_vocab_gguf(model, root / "gguf" / "vocab.gguf", arch, prefix)
    return {"sp": spm.SentencePieceProcessor(model_file=str(model)), "gguf": path, "ours": Tokenizer.from_gguf(path),
            "prefix": prefix}


def test_ids_equal_sentencepiece(vocab) -> None:
    ours, sp = vocab["ours"], vocab["sp"]
    for text in TEXTS:
        if vocab["prefix"] and any(t in text for t in SPM_USER_DEFINED):
            # After a user-defined piece llama.cpp (and ignis) give the text its "▁" again;
            # SentencePiece prefixes the text once.
            continue
        # User-defined pieces are markup: matched in template text only (client text never
        # reaches them; Gemma's real ones are whitespace runs, kept for plain text too).
        special = any(t in text for t in SPM_USER_DEFINED)
        assert ours.encode(text, add_bos=False, special=special) == sp.encode(text), text


def test_ids_equal_transformers_reading_the_gguf(vocab) -> None:
    from transformers import AutoTokenizer

    path = vocab["gguf"]
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ours = vocab["ours"]
    for text in TEXTS:
        special = any(t in text for t in SPM_USER_DEFINED)
        if vocab["prefix"] and (text[:1].isspace() or special):
            # transformers' Metaspace adds no "▁" to text that opens with one (SentencePiece
            # does), nor after an added token (llama.cpp does)
            continue
        assert ours.encode(text, add_bos=False, special=special) == hf.encode(text, add_special_tokens=False), text


def test_decode_round_trips_and_streams(vocab) -> None:
    ours = vocab["ours"]
    for text in TEXTS:
        ids = ours.encode(text, add_bos=False, special=True)
        assert ours.decode(ids) == vocab["sp"].decode(ids)
        dec = IncrementalDecoder(ours)
        assert "".join(dec.add(i) for i in ids) + dec.flush() == ours.decode(ids)


def test_specials_bos_and_byte_fallback(vocab) -> None:
    ours, sp = vocab["ours"], vocab["sp"]
    assert (ours.bos_token, ours.eos_token, ours.add_bos) == ("<bos>", "<eos>", True)
    assert ours.encode("hi")[0] == ours.bos_token_id == 2
    # A control piece is special only in template text.
    assert ours.encode("<bos>", special=True, add_bos=False) == [2]
    assert ours.encode("<bos>", add_bos=False) != [2]
    # A character outside the vocabulary falls back to its UTF-8 bytes.
    ids = ours.encode("🦀", add_bos=False)
    assert [sp.id_to_piece(i) for i in ids][-4:] == ["<0xF0>", "<0x9F>", "<0xA6>", "<0x80>"]
    assert ours.decode(ids).strip() == "🦀"
