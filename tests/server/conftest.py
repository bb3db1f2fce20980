"""Fixtures: a tiny random Qwen3-style model (built once per session), and real ignis
servers on 127.0.0.1 (ephemeral ports), each in a background thread of this process
with its own engine. See server_harness.py for the client helpers."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for extra in (HERE, HERE.parent / "model", HERE.parent / "protocol"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from ignis.model import LoadedModel, load_model  # noqa: E402
from ignis.server.background import BackgroundServer  # noqa: E402
from server_harness import make_config  # noqa: E402


CODEX_DATA = HERE.parent / "protocol" / "data" / "codex_requests.jsonl"
TOKENIZER_VOCAB = 4096


def _strings(obj: object) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def build_server_tokenizer(path: Path) -> Path:
    """tiny_models' tokenizer (ChatML specials, Qwen3-style template), with a 4096-entry BPE
    trained on its sentences plus the text of the recorded Codex requests: the same
    prompts in a fifth of the tokens, so replaying them stays quick on a CPU."""
    import json

    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from tiny_models import ADDED_TOKENS, CHAT_TEMPLATE, SENTENCES, SPECIAL_TOKENS

    corpus = list(SENTENCES)
    for line in CODEX_DATA.read_text().splitlines():
        entry = json.loads(line)
        corpus.extend(_strings(entry.get("body") or entry.get("frame")))
        corpus.append(json.dumps((entry.get("body") or entry.get("frame")).get("tools", [])))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB - len(ADDED_TOKENS), special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    tok.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": 65536, "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return path


@pytest.fixture(scope="session")
def tiny_server_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    from tiny_models import build_tiny_model

    path = tmp_path_factory.mktemp("server") / "tiny-qwen3"
    # Random weights; ids 0, 1, 2 are <|endoftext|>, <|im_start|>, <|im_end|> (trained first).
    build_tiny_model(path, "qwen3", seed=5, with_tokenizer=False, vocab_size=TOKENIZER_VOCAB + 16,
                     eos_token_id=2, max_position_embeddings=65536)
    build_server_tokenizer(path)
    return load_model(str(path), dtype="float32", device="cpu", name="tiny", progress=False)


@pytest.fixture(scope="session")
def start_server(tiny_server_model: LoadedModel) -> Iterator[Callable[..., BackgroundServer]]:
    """start_server(engine={...}, **server_keys) -> a running BackgroundServer, stopped at
    the end of the session (or by the test)."""
    started: list[BackgroundServer] = []

    def start(*, engine: dict | None = None, **server: object) -> BackgroundServer:
        srv = BackgroundServer(make_config(engine=engine, **server), tiny_server_model).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def srv(start_server: Callable[..., BackgroundServer]) -> BackgroundServer:
    """The shared server: API key set, model 'tiny' alias 'fake-model', roomy engine."""
    return start_server()
