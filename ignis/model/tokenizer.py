"""The tokenizer: a `tokenizers` pipeline built from GGUF metadata or a Hugging Face directory.

Two instances of the same pipeline are kept. `_full` matches added tokens (`<|im_start|>`,
`<think>`...) in text and is used only for text the chat template produced; `_plain` has no
markup tokens at all, so text from a client can never turn into one. Two immutable instances
instead of toggling `encode_special_tokens` keep encoding thread-safe without a lock.

`IncrementalDecoder` turns a stream of ids into text without ever emitting half a character.
"""

from __future__ import annotations

import codecs
import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import tokenizers

log = logging.getLogger(__name__)

T = TypeVar("T")
_MISSING = object()

# llama.cpp's token types (`tokenizer.ggml.token_type`).
_NORMAL = 1
_UNKNOWN = 2
_CONTROL = 3
_USER_DEFINED = 4
_UNUSED = 5
_BYTE = 6
_SPACE = "\u2581"  # SentencePiece's visible space

# Strings that end a turn in the chat formats we know. Any of them that is an added token of a
# vocabulary joins `eos_token_ids` (llama.cpp treats the same list as end-of-generation).
_END_OF_TURN_STRINGS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|return|>",
    "<｜end▁of▁sentence｜>",
)
# A vocabulary with all of these speaks harmony, where `<|end|>` (Phi-3's end of turn) only
# closes a message: analysis, then the final answer, follow in one generation.
_HARMONY_MARKS = frozenset({"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>"})

# --- pre-tokenizers -----------------------------------------------------------------------------
# Each vocabulary's merges were learned on text split a particular way; encoding must split the
# same way. These are the regexes of llama.cpp's `tokenizer.ggml.pre` families.

# GPT-2's split, which `ByteLevel(use_regex=True)` applies by itself.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Llama 3 (tiktoken cl100k): letters may take one leading non-letter, numbers in groups of 3.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2: Llama 3's split, but every digit alone.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_BYTE_LEVEL_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_BYTE_LEVEL_ONLY = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def _split(regex: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


def _sequence(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"type": "Sequence", "pretokenizers": list(steps)}


_GPT2 = _BYTE_LEVEL_REGEX
# SmolLM2 and the StarCoder family: every digit alone, then GPT-2's split. This is exactly the
# pre-tokenizer of SmolLM2's own tokenizer.json.
_DIGITS_THEN_GPT2 = _sequence({"type": "Digits", "individual_digits": True}, _BYTE_LEVEL_REGEX)
_LLAMA3 = _sequence(_split(_LLAMA3_SPLIT), _BYTE_LEVEL_ONLY)
# Splits that always begin a new piece at a space between two letters, and never join
# across it: text cut there tokenizes, part by part, to the same ids as whole.
_WORD_SPACE_SPLITS = {_GPT2_SPLIT, _LLAMA3_SPLIT, _QWEN2_SPLIT}
_QWEN2 = _sequence(_split(_QWEN2_SPLIT), _BYTE_LEVEL_ONLY)

# tokenizer.ggml.pre -> pre-tokenizer (llama.cpp's grouping of the names).
_GGUF_PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "default": _GPT2,
    "gpt2": _GPT2,
    "gpt-2": _GPT2,
    "smollm": _DIGITS_THEN_GPT2,
    "starcoder": _DIGITS_THEN_GPT2,
    "refact": _DIGITS_THEN_GPT2,
    "codeshell": _DIGITS_THEN_GPT2,
    "exaone": _DIGITS_THEN_GPT2,
    "minerva-7b": _DIGITS_THEN_GPT2,
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "falcon3": _LLAMA3,
    "smaug-bpe": _LLAMA3,
    "dbrx": _LLAMA3,
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
}
# Llama 3 vocabularies come from tiktoken, which takes a whole split piece that is in the
# vocabulary before trying merges; llama.cpp also adds BOS by default for them.
_TIKTOKEN_STYLE = {"llama-bpe", "llama3", "llama-v3", "falcon3"}
# Qwen2's tokenizer.json normalizes to NFC; a GGUF loses the normalizer, so put it back.
_NFC_PRE = {"qwen2", "deepseek-r1-qwen"}


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character spelling used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def _added_token(token_id: int, content: str, special: bool) -> dict[str, Any]:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def _gguf_value(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.get_field(key)
    return default if field is None else field.contents()


def _token_string(value: Any) -> str | None:
    """tokenizer_config.json spells a special token as a string or as an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _cuts_at_word_spaces(spec: dict[str, Any]) -> bool:
    """Whether the pipeline `spec` always starts a pre-token at a space between two letters
    and is otherwise blind to where the text was cut (see `Tokenizer.cuts_at_word_spaces`)."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout"):
        return False
    if (spec.get("normalizer") or {"type": "NFC"}).get("type") != "NFC":  # NFC never joins across a space
        return False
    pre = spec.get("pre_tokenizer") or {}
    steps = (pre.get("pretokenizers") or []) if pre.get("type") == "Sequence" else [pre]
    splits = False
    for step in steps:
        kind = step.get("type")
        if kind == "ByteLevel" and not step.get("add_prefix_space"):
            splits |= bool(step.get("use_regex", True))
        elif kind == "Split" and (step.get("pattern") or {}).get("Regex") in _WORD_SPACE_SPLITS:
            if step.get("behavior") != "Isolated" or step.get("invert"):
                return False
            splits = True
        elif kind != "Digits":
            return False
    return splits


def _ids_from(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


def _gguf_vocab(tokens: list[str], types: list[int]) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """A GGUF vocabulary as the BPE model's (spelling -> id) and its added tokens."""
    spelling = byte_to_unicode()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    added: list[dict[str, Any]] = []
    for token_id, (token, token_type) in enumerate(zip(tokens, types)):
        if token_type in (_CONTROL, _USER_DEFINED):
            # Kept as written, so the added token and the vocabulary entry share this id.
            key = token
            added.append(_added_token(token_id, token, special=token_type == _CONTROL))
        elif set(token) <= alphabet:
            key = token
        else:
            # llama.cpp writes some tokens as raw text; the BPE model needs the byte spelling.
            key = "".join(spelling[b] for b in token.encode("utf-8"))
        if key in vocab:
            log.warning("GGUF vocabulary repeats %r (ids %d and %d); keeping the first", key, vocab[key], token_id)
            continue
        vocab[key] = token_id
    return vocab, added


def _gguf_pipeline_spec(tokens: list[str], types: list[int], merges: list[str], pre: str) -> dict[str, Any]:
    """The `tokenizers` pipeline (JSON) of a GGUF byte-level BPE whose pre-tokenizer
    `tokenizer.ggml.pre` names."""
    pre_tokenizer = _GGUF_PRE_TOKENIZERS.get(pre)
    if pre_tokenizer is None:
        log.warning("unknown GGUF pre-tokenizer %r: splitting text as GPT-2 does", pre)
        pre_tokenizer = _GPT2
    vocab, added = _gguf_vocab(tokens, types)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"} if pre in _NFC_PRE else None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": pre in _TIKTOKEN_STYLE,
            "vocab": vocab,
            "merges": [m.split(" ", 1) for m in merges],
        },
    }


def _spm_merges(tokens: list[str], types: list[int], rank: list[float]) -> list[list[str]]:
    """The BPE merges a SentencePiece vocabulary implies: every split of a normal piece into
    two normal pieces, best piece first (`rank`: higher merges earlier), then longer left
    halves first. SentencePiece's own BPE merges the adjacent pair whose joined piece ranks
    best, which a merge list in this order reproduces."""
    normal = {t: i for i, (t, k) in enumerate(zip(tokens, types)) if k == _NORMAL}
    found: list[tuple[float, int, int, int, str, str]] = []
    for token, i in normal.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            li, ri = normal.get(left), normal.get(right)
            if li is not None and ri is not None:
                found.append((-rank[i], -len(left), -len(right), i, left, right))
    found.sort(key=lambda m: m[:4])
    return [[left, right] for *_, left, right in found]


def _gguf_spm_spec(tokens: list[str], types: list[int], scores: list[float], *, space_prefix: bool,
                   file_order: bool, unk: str | None) -> dict[str, Any]:
    """The `tokenizers` pipeline (JSON) of a GGUF SentencePiece vocabulary (`llama`
    tokenizer model): BPE over "▁"-spelled text with byte fallback (<0xNN> pieces).

    Control pieces are special added tokens; user-defined ones (Gemma's runs of newlines
    and spaces, <start_of_image>...) are matched whole wherever they occur, as
    SentencePiece and llama.cpp match them, and are stored as written (real spaces).
    `space_prefix` (tokenizer.ggml.add_space_prefix): a "▁" before the text (Llama 2);
    Gemma has none. Runs of spaces stored as "▁"s are matched as Gemma writes them. `file_order`: merges ranked by position in the file rather than by
    score (Gemma's scores do not give its merge order)."""
    vocab: dict[str, int] = {}
    added: list[dict[str, Any]] = []
    for token_id, (token, kind) in enumerate(zip(tokens, types)):
        if kind in (_CONTROL, _USER_DEFINED) or (kind == _UNKNOWN and token != unk):
            added.append(_added_token(token_id, token, special=kind != _USER_DEFINED))
        if token in vocab:
            continue
        vocab[token] = token_id
    rank = [-float(i) for i in range(len(tokens))] if file_order else [float(x) for x in scores]
    merges = _spm_merges(tokens, types, rank)
    decoders: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": _SPACE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if space_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        # With a space prefix every stretch of text between added tokens gets its "▁", as
        # llama.cpp prefixes each raw-text fragment that opens the text or follows a special
        # token (the normalizer runs per stretch).
        "normalizer": {"type": "Sequence", "normalizers": [
            *([{"type": "Prepend", "prepend": _SPACE}] if space_prefix else []),
            {"type": "Replace", "pattern": {"String": " "}, "content": _SPACE},
        ]},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unk,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def _over_model(full: tokenizers.Tokenizer, added: list[dict[str, Any]]) -> tokenizers.Tokenizer | None:
    """A pipeline over `full`'s own model (shared, not copied: a 262k vocabulary's BPE model is
    ~100 MB) and its normalizer, pre-tokenizer, post-processor and decoder, with only the
    `added` tokens; None where the ids it gives them differ from theirs."""
    t = tokenizers.Tokenizer(full.model)
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        value = getattr(full, part)
        if value is not None:
            setattr(t, part, value)
    t.add_tokens([
        tokenizers.AddedToken(a["content"], single_word=a.get("single_word", False), lstrip=a.get("lstrip", False),
                              rstrip=a.get("rstrip", False), normalized=a.get("normalized", True),
                              special=a.get("special", False))
        for a in added
    ])
    return t if all(t.token_to_id(a["content"]) == a["id"] for a in added) else None


class Tokenizer:
    """Encode and decode text for one model.

    `cuts_at_word_spaces`: text cut at a space between two letters tokenizes, part by part,
    to the ids of the whole (the regex byte-level pre-tokenizers above always start a piece
    there, and nothing joins across it), so a long text can be tokenized in parallel parts.

    `eos_token_ids` is every id that ends generation: the model's EOS, the EOS ids of its
    generation_config.json (HF) or its EOT/EOM ids (GGUF), and every added token that spells a
    known end of turn (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, ...). SmolLM2, for example,
    ends turns with `<|im_end|>` (its EOS) and also stops on `<|endoftext|>`.
    """

    def __init__(
        self,
        pipeline: tokenizers.Tokenizer | dict[str, Any],
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        unk_token: str | None = None,
        add_bos: bool = False,
        extra_eos_ids: Iterable[int] = (),
    ) -> None:
        # A pipeline's JSON spec may come as a dict (a GGUF's, built here: a 262k vocabulary
        # spares a serialisation round trip).
        spec = dict(pipeline) if isinstance(pipeline, dict) else json.loads(pipeline.to_str())
        spec["truncation"] = None
        spec["padding"] = None
        spec["added_tokens"] = [dict(t) for t in spec.get("added_tokens") or ()]
        for token in spec["added_tokens"]:
            if not token["content"].isspace():
                # Markup matches only as written: a normalizer (NFKC, lowercase...) must not turn
                # client text such as a full-width "＜think＞" into it.
                token["normalized"] = False
        self._full = tokenizers.Tokenizer.from_str(json.dumps(spec))
        # The plain pipeline keeps only whitespace added tokens (some vocabularies add runs of
        # spaces as tokens for ordinary text); anything else is markup a client must not reach.
        spec["added_tokens"] = [t for t in spec.get("added_tokens") or () if t["content"].isspace()]
        self._plain = _over_model(self._full, spec["added_tokens"]) or tokenizers.Tokenizer.from_str(json.dumps(spec))
        self._byte_level = (spec.get("decoder") or {}).get("type") == "ByteLevel"
        self.cuts_at_word_spaces = _cuts_at_word_spaces(spec)
        self._token_bytes: list[bytes] | None = None
        self._max_token_bytes: int | None = None
        self._pieces: dict[int, tuple[str, bytes | None]] = {}
        self._single_ids: dict[str, int | None] = {}
        self._memo: dict[Any, Any] = {}
        self._memo_locks: dict[Any, threading.Lock] = {}
        self._memo_lock = threading.Lock()

        added = self._full.get_added_tokens_decoder()
        self.added_tokens: dict[str, int] = {t.content: i for i, t in added.items()}
        self.special_token_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        # Added tokens that are markup; encode_chat keeps these out of client text.
        self.control_tokens: tuple[str, ...] = tuple(
            sorted((c for c in self.added_tokens if not c.isspace()), key=len, reverse=True)
        )

        self.bos_token, self.eos_token, self.pad_token, self.unk_token = bos_token, eos_token, pad_token, unk_token
        self.bos_token_id = self._id_or_none(bos_token)
        self.eos_token_id = self._id_or_none(eos_token)
        self.pad_token_id = self._id_or_none(pad_token)
        self.unk_token_id = self._id_or_none(unk_token)
        self.add_bos = bool(add_bos) and self.bos_token_id is not None
        eos = {i for i in (self.eos_token_id, *extra_eos_ids) if i is not None}
        ends = [s for s in _END_OF_TURN_STRINGS if s in self.added_tokens]
        if _HARMONY_MARKS.issubset(self.added_tokens):
            ends.remove("<|end|>")  # harmony (gpt-oss): it ends one message; <|return|> and <|call|> end the turn
        eos.update(self.added_tokens[s] for s in ends)
        self.eos_token_ids: frozenset[int] = frozenset(eos)

    # --- construction ----------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, reader: Any) -> Tokenizer:
        """Build from a `gguf.GGUFReader` (or a path to a .gguf file): a byte-level BPE
        (`tokenizer.ggml.model == "gpt2"`) with the pre-tokenizer `tokenizer.ggml.pre` names,
        or a SentencePiece vocabulary (`"llama"`: Llama 2, Gemma, Phi-3) with byte fallback."""
        if isinstance(reader, (str, Path)):
            import gguf

            reader = gguf.GGUFReader(reader)
        kind = _gguf_value(reader, "tokenizer.ggml.model")
        if kind not in ("gpt2", "llama"):
            raise NotImplementedError(
                f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2', SentencePiece 'llama')"
            )
        tokens: list[str] = _gguf_value(reader, "tokenizer.ggml.tokens")
        types: list[int] = _gguf_value(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
        pre = _gguf_value(reader, "tokenizer.ggml.pre", "default")

        def token_at(key: str) -> str | None:
            token_id = _gguf_value(reader, f"tokenizer.ggml.{key}")
            return tokens[token_id] if isinstance(token_id, int) and 0 <= token_id < len(tokens) else None

        if kind == "gpt2":
            merges: list[str] = _gguf_value(reader, "tokenizer.ggml.merges") or []
            spec = _gguf_pipeline_spec(tokens, types, merges, pre)
            add_bos_default = pre in _TIKTOKEN_STYLE
        else:
            arch = str(_gguf_value(reader, "general.architecture", ""))
            spec = _gguf_spm_spec(
                tokens, types, _gguf_value(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens),
                space_prefix=bool(_gguf_value(reader, "tokenizer.ggml.add_space_prefix", True)),
                file_order=arch.startswith("gemma"), unk=token_at("unknown_token_id"),
            )
            add_bos_default = True  # llama.cpp's default for SentencePiece vocabularies

        extra_eos = [
            i
            for key in ("eot_token_id", "eom_token_id")
            if isinstance(i := _gguf_value(reader, f"tokenizer.ggml.{key}"), int) and 0 <= i < len(tokens)
        ]
        return cls(
            spec,
            bos_token=token_at("bos_token_id"),
            eos_token=token_at("eos_token_id"),
            pad_token=token_at("padding_token_id"),
            unk_token=token_at("unknown_token_id"),
            add_bos=_gguf_value(reader, "tokenizer.ggml.add_bos_token", add_bos_default),
            extra_eos_ids=extra_eos,
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """Build from a Hugging Face directory: tokenizer.json, plus tokenizer_config.json (added
        tokens, special token strings, add_bos_token) and generation_config.json (EOS ids)."""
        path = Path(path)
        pipeline = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        config = _read_json(path / "tokenizer_config.json")

        # Tokens declared only in tokenizer_config.json (older saves) still have to be matched.
        for declared_id, entry in (config.get("added_tokens_decoder") or {}).items():
            content = entry.get("content")
            if content is None or pipeline.token_to_id(content) is not None:
                continue
            token = tokenizers.AddedToken(
                content,
                single_word=entry.get("single_word", False),
                lstrip=entry.get("lstrip", False),
                rstrip=entry.get("rstrip", False),
                normalized=entry.get("normalized", not entry.get("special", False)),
                special=entry.get("special", False),
            )
            if token.special:
                pipeline.add_special_tokens([token])
            else:
                pipeline.add_tokens([token])
            if pipeline.token_to_id(content) != int(declared_id):
                got = pipeline.token_to_id(content)
                log.warning("added token %r got id %s, not the declared %s", content, got, declared_id)

        bos = _token_string(config.get("bos_token"))
        add_bos = config.get("add_bos_token")
        if not isinstance(add_bos, bool):
            # Without the flag, the tokenizer.json post-processor (e.g. Llama 3's) decides.
            bos_id = pipeline.token_to_id(bos) if bos else None
            add_bos = bos_id is not None and pipeline.encode("", add_special_tokens=True).ids[:1] == [bos_id]
        generation = _read_json(path / "generation_config.json")
        return cls(
            pipeline,
            bos_token=bos,
            eos_token=_token_string(config.get("eos_token")),
            pad_token=_token_string(config.get("pad_token")),
            unk_token=_token_string(config.get("unk_token")),
            add_bos=add_bos,
            extra_eos_ids=_ids_from(generation.get("eos_token_id")),
        )

    # --- encoding and decoding -------------------------------------------------------------------

    def encode(self, text: str, *, special: bool = False, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`.

        special=False: `text` is plain text; `<|im_start|>` or `<think>` in it are just characters.
        special=True: added tokens in `text` become their ids (only for text a template produced).
        add_bos: prepend BOS; None follows the model (GGUF add_bos_token / the HF post-processor).
        """
        ids = (self._full if special else self._plain).encode(text, add_special_tokens=False).ids
        if self.add_bos if add_bos is None else add_bos:
            if self.bos_token_id is None:
                raise ValueError("this tokenizer has no BOS token")
            ids.insert(0, self.bos_token_id)
        return ids

    def encode_batch(self, texts: Sequence[str], *, special: bool = False) -> list[list[int]]:
        """`encode(t, special=special, add_bos=False)` of each text, in one call (the Rust
        side may spread a batch over threads)."""
        pipeline = self._full if special else self._plain
        # The _fast variant skips character offsets, which ids do not need (~10% faster).
        return [e.ids for e in pipeline.encode_batch_fast(list(texts), add_special_tokens=False)]

    def pipeline_json(self) -> str:
        """The special-parsing pipeline as tokenizers serialises it (its added tokens' rules)."""
        return self._full.to_str()

    def added_token_spans(self, text: str) -> list[tuple[int, int, int]]:
        """(start, end, id) of each added token the special-parsing encoder finds in `text`,
        with the matching rules (lstrip, rstrip...) of the tokenizer itself."""
        encoding = self._full.encode(text, add_special_tokens=False)
        added_ids = set(self.added_tokens.values())
        return [(s, e, i) for i, (s, e) in zip(encoding.ids, encoding.offsets) if i in added_ids]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._full.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows, added tokens included (the embedding may be larger)."""
        return self._full.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry, spelled as the vocabulary spells it (byte-level: 'Ġhi')."""
        return self._full.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._full.id_to_token(token_id)

    @property
    def is_byte_level(self) -> bool:
        return self._byte_level

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a byte-level token stands for (added tokens: their UTF-8 text)."""
        if not self._byte_level:
            raise ValueError("token_bytes needs a byte-level vocabulary")
        table = self._token_bytes
        if table is None:
            table = self._token_bytes = self._byte_table()
        return table[token_id] if 0 <= token_id < len(table) else b""

    @property
    def max_token_bytes(self) -> int | None:
        """The most UTF-8 bytes one token stands for (added tokens included), on a byte-level
        vocabulary; None elsewhere. A text of N characters (at least N bytes) is then at
        least N / max_token_bytes tokens: the cheap bound checked before tokenizing."""
        if not self._byte_level:
            return None
        if self._max_token_bytes is None:
            self._max_token_bytes = max(1, max(len(self.token_bytes(i)) for i in range(self.vocab_size)))
        return self._max_token_bytes

    def normalized_length(self, text: str) -> int:
        """Characters of `text` after the pipeline's normalizer (Qwen2's NFC can compose a few
        characters into one), which is what the tokens cover."""
        normalizer = self._full.normalizer
        return len(text) if normalizer is None else len(normalizer.normalize_str(text))

    # --- per-tokenizer caches ----------------------------------------------------------------

    def piece(self, token_id: int) -> tuple[str, bytes | None]:
        """(the id decoded alone, specials included; its bytes on a byte-level vocabulary,
        else None), cached: a logprobs step names 1 + N ids, each decoded once per model."""
        piece = self._pieces.get(token_id)
        if piece is None:
            raw = self.token_bytes(token_id) if self._byte_level else None
            piece = self._pieces[token_id] = (self._full.decode([token_id], skip_special_tokens=False), raw)
        return piece

    def single_token_id(self, text: str) -> int | None:
        """The id `text` encodes to (added tokens matched) when that is one token, else None;
        cached per text (a chat format's tags, asked for on every request)."""
        if text not in self._single_ids:
            ids = self.encode(text, special=True, add_bos=False)
            self._single_ids[text] = ids[0] if len(ids) == 1 else None
        return self._single_ids[text]

    def memo(self, key: Any, build: Callable[[], T]) -> T:
        """`build()` once per key for the life of this tokenizer: tables other packages
        derive from it (the engine's token index, llguidance's tokenizer). Thread-safe (a
        server warms them in worker threads while the engine may ask); one key's build
        never waits on another's."""
        value = self._memo.get(key, _MISSING)
        if value is _MISSING:
            with self._memo_lock:
                lock = self._memo_locks.setdefault(key, threading.Lock())
            with lock:
                value = self._memo.get(key, _MISSING)
                if value is _MISSING:
                    value = self._memo[key] = build()
        return value  # type: ignore[return-value]

    def _byte_table(self) -> list[bytes]:
        unspell = {c: b for b, c in byte_to_unicode().items()}
        added = self._full.get_added_tokens_decoder()
        table = [b""] * self.vocab_size
        for token_id in range(len(table)):
            if token_id in added:
                table[token_id] = added[token_id].content.encode("utf-8")
            elif (token := self._full.id_to_token(token_id)) is not None:
                table[token_id] = bytes(unspell[c] for c in token if c in unspell)
        return table

    def _id_or_none(self, token: str | None) -> int | None:
        return None if token is None else self._full.token_to_id(token)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, eos={self.eos_token!r})"


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


class IncrementalDecoder:
    """Text from a stream of token ids, one id at a time.

    `add(id)` returns the text completed by that id ("" while a character is still split across
    tokens); `flush()` returns what is left at the end. The pieces concatenate to
    `tokenizer.decode(ids)`. Byte-level vocabularies go through an incremental UTF-8 decoder;
    others re-decode a short window of ids and hold text back while it ends in U+FFFD.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace") if tokenizer.is_byte_level else None
        self._ids: list[int] = []
        self._prefix = 0  # window start: decoded for context, already emitted
        self._read = 0  # ids before this are emitted

    def add(self, token_id: int) -> str:
        if self._utf8 is not None:
            if self._skip and token_id in self._tokenizer.special_token_ids:
                return ""
            return self._utf8.decode(self._tokenizer.token_bytes(token_id))
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Text still held back (an incomplete character at the end becomes U+FFFD)."""
        if self._utf8 is not None:
            return self._utf8.decode(b"", final=True)
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        decode = self._tokenizer.decode
        before = decode(self._ids[self._prefix : self._read], skip_special_tokens=self._skip)
        after = decode(self._ids[self._prefix :], skip_special_tokens=self._skip)
        if not final and (len(after) <= len(before) or after.endswith("\ufffd")):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]
