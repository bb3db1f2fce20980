"""The prompt token cache (ignis.model.token_cache): tokenizing only the pieces of a rendered
prompt not seen before gives exactly the ids of tokenizing it whole, for the tokenizers
ignis loads (SmolLM2's GGUF BPE, a Hugging Face byte-level BPE with added tokens, a
Metaspace vocabulary that treats the first split apart), through encode_chat's ordinary and
markup-neutralising paths; and a vocabulary it cannot cut exactly turns it off."""

from __future__ import annotations

import json
import random

import pytest

from ignis.model.chat_template import ChatTemplate, encode_chat
from ignis.model.client_text import Neutralizer
from ignis.model.token_cache import TokenCache, TokenCount
from ignis.model.tokenizer import Tokenizer
from tests.model.tiny_models import (
    ADDED_TOKENS,
    CHAT_TEMPLATE,
    SENTENCES,
    SPECIAL_TOKENS,
    build_tiny_tokenizer,
)
from tests.model.tokenizer_oracles import TEXTS, smollm2_template, smollm2_tokenizer


def _metaspace_tokenizer(tmp_path, *, lstrip: bool = False) -> Tokenizer:
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HfTokenizer

    tok = HfTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", *SPECIAL_TOKENS], show_progress=False)
    tok.train_from_iterator(SENTENCES + TEXTS + ["0123456789"], trainer)  # no <unk> for a digit
    tok.add_tokens([AddedToken(t, special=False, normalized=False, lstrip=lstrip) for t in ADDED_TOKENS])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE}))
    return Tokenizer.from_hf_dir(tmp_path)


@pytest.fixture(scope="module", params=["smollm2", "bpe", "metaspace"])
def tokenizer(request, tmp_path_factory) -> Tokenizer:
    if request.param == "smollm2":
        return smollm2_tokenizer()
    if request.param == "bpe":
        return Tokenizer.from_hf_dir(build_tiny_tokenizer(tmp_path_factory.mktemp("bpe")))
    return _metaspace_tokenizer(tmp_path_factory.mktemp("metaspace"))


def _random_text(rng: random.Random, marks: list[str]) -> str:
    parts = []
    for _ in range(rng.randrange(1, 12)):
        parts.append(rng.choice(TEXTS + SENTENCES + ["", " ", "\n", "  x", "user\n"]))
        if rng.random() < 0.7:
            parts.append(rng.choice(marks))
    return "".join(parts)


def test_pieces_give_the_ids_of_the_whole_text(tokenizer: Tokenizer) -> None:
    cache = TokenCache(tokenizer)
    assert cache.enabled, cache.why_off
    rng = random.Random(7)
    marks = list(tokenizer.control_tokens)
    texts = [_random_text(rng, marks) for _ in range(200)]
    for text in texts + texts:  # cold, then every piece from the cache
        assert cache.encode(text) == tokenizer.encode(text, special=True, add_bos=False), repr(text)
        assert cache.added_token_spans(text) == tokenizer.added_token_spans(text), repr(text)
    for text in texts[:20]:
        assert cache.encode_plain([text, text[::-1]]) == [tokenizer.encode(t, special=False, add_bos=False)
                                                         for t in (text, text[::-1])]
    assert cache.reused > 0


def test_a_growing_conversation_tokenizes_only_what_is_new(tokenizer: Tokenizer) -> None:
    template = smollm2_template() if tokenizer is smollm2_tokenizer() else ChatTemplate(CHAT_TEMPLATE)
    cache = TokenCache(tokenizer)
    messages = [{"role": "system", "content": "You are a coding agent. " * 20}]
    for turn in range(8):
        messages.append({"role": "user", "content": f"turn {turn}: " + " ".join(SENTENCES[turn % len(SENTENCES):])})
        count = TokenCount()
        got = encode_chat(tokenizer, template, messages, token_cache=cache, token_count=count)
        want = encode_chat(tokenizer, template, messages)
        assert got == want
        assert count.tokenized + count.reused == len(got)
        if turn:  # the history came from the cache: only the new messages and the prompt tail
            new = sum(len(tokenizer.encode(m["content"])) for m in messages[-2:])
            assert count.tokenized <= new + 16, (count, new)
        messages.append({"role": "assistant", "content": f"Answer {turn}. " + SENTENCES[turn]})


def test_markup_in_client_text_takes_the_neutralising_path_with_the_same_ids(tokenizer: Tokenizer) -> None:
    template = ChatTemplate(CHAT_TEMPLATE)
    cache = TokenCache(tokenizer, max_tokens=64)  # small: evictions along the way
    marks = list(tokenizer.control_tokens)
    rng = random.Random(3)
    for _ in range(30):
        messages = [{"role": rng.choice(["user", "assistant"]), "content": _random_text(rng, marks)} for _ in range(4)]
        messages.append({"role": "user", "content": "end " + rng.choice(marks)[:3]})  # a fragment at an edge
        assert encode_chat(tokenizer, template, messages, token_cache=cache) == encode_chat(tokenizer, template, messages)
    assert cache._held <= 64 or len(cache._store) == 1


def test_the_cache_and_the_neutralizer_share_one_markup_regex(tokenizer: Tokenizer) -> None:
    # A vocabulary of 79k reserved tokens compiles to ~20 MB: held once, not once per user.
    cut = TokenCache(tokenizer)._cut
    assert cut is not None and cut is Neutralizer(reversed(tokenizer.control_tokens))._pattern
    assert cut.fullmatch(max(tokenizer.control_tokens, key=len))


def test_a_vocabulary_it_cannot_cut_exactly_turns_it_off(tmp_path) -> None:
    tokenizer = _metaspace_tokenizer(tmp_path, lstrip=True)
    cache = TokenCache(tokenizer)
    assert not cache.enabled and "strips whitespace" in cache.why_off
    text = "a  <think> b </think>  c"
    assert cache.encode(text) == tokenizer.encode(text, special=True, add_bos=False)


def _with_pipeline(tokenizer: Tokenizer, **changes) -> Tokenizer:
    """The same vocabulary with other pipeline steps (pre-tokenizer, normalizer...)."""
    from tokenizers import Tokenizer as HfTokenizer

    from ignis.model import tokenizer as tokenizer_module

    spec = json.loads(tokenizer.pipeline_json())
    spec.update({k: getattr(tokenizer_module, v) if isinstance(v, str) else v for k, v in changes.items()})
    return Tokenizer(HfTokenizer.from_str(json.dumps(spec)), eos_token="<|im_end|>")


def _long_text(rng: random.Random, marks: list[str]) -> str:
    pieces = TEXTS + SENTENCES + ["x", "don't", "É", "ü", "2024", "  ", "\n", "\t", "a  b"]
    words = [rng.choice(pieces) + rng.choice([" ", " ", "", "\n", "  "]) for _ in range(rng.randrange(20, 200))]
    if marks and rng.random() < 0.5:
        words.insert(0, rng.choice(marks))
    return "".join(words)


def test_long_texts_are_cut_at_word_spaces_with_the_ids_of_the_whole(tokenizer: Tokenizer, monkeypatch) -> None:
    from ignis.model import token_cache

    cache = TokenCache(tokenizer)
    metaspace = not tokenizer.cuts_at_word_spaces
    assert cache.cuts_words is not metaspace
    monkeypatch.setattr(token_cache, "_PART_CHARS", 24)  # many parts per text
    rng = random.Random(11)
    marks = list(tokenizer.control_tokens)
    cut = 0
    for _ in range(60):
        text = _long_text(rng, marks)
        cut += len(cache._parts(text)) > 1
        assert cache.encode(text) == tokenizer.encode(text, special=True, add_bos=False), repr(text)
        assert cache.encode_plain([text]) == [tokenizer.encode(text, special=False, add_bos=False)], repr(text)
    assert cut == (0 if metaspace else 60)


@pytest.mark.parametrize(
    ("changes", "cuts"),
    [
        ({}, True),
        ({"pre_tokenizer": "_LLAMA3", "normalizer": None}, True),
        ({"pre_tokenizer": "_QWEN2", "normalizer": {"type": "NFC"}}, True),
        ({"pre_tokenizer": "_GPT2", "normalizer": {"type": "Lowercase"}}, False),
        ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}},
         False),
        ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": r"\w+ \w+|\s+"}, "behavior": "Isolated",
                            "invert": False}}, False),
        ({"pre_tokenizer": {"type": "Whitespace"}}, False),
    ],
)
def test_word_space_cuts_only_for_pre_tokenizers_that_split_there(changes, cuts) -> None:
    tokenizer = _with_pipeline(smollm2_tokenizer(), **changes)
    assert tokenizer.cuts_at_word_spaces is cuts
    cache = TokenCache(tokenizer)
    assert cache.cuts_words is cuts
    if cuts:  # the Llama 3 and Qwen2 splits: the same ids in parts, on long texts
        rng = random.Random(5)
        for _ in range(10):
            text = _long_text(rng, list(tokenizer.control_tokens))
            assert cache.encode(text) == tokenizer.encode(text, special=True, add_bos=False), repr(text)
