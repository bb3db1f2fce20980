"""Test-wide setup. Triton's interpreter must be chosen before triton is first imported,
so this runs before any test module (and so before `ignis_kernels`) is collected."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
# Nothing is ever fetched from a model hub, in tests or anywhere else.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

TESTS = Path(__file__).resolve().parent

SCRIPT = TESTS / "clients" / "script.yaml"


# -- a tiny random Qwen3-style model and real servers over it (tests/server, browser,
# reliability) -----------------------------------------------------------------------

CODEX_DATA = TESTS / "protocol" / "data" / "codex_requests.jsonl"
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
    from tests.model.tiny_models import ADDED_TOKENS, CHAT_TEMPLATE, SENTENCES, SPECIAL_TOKENS

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
def tiny_server_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from ignis.model import load_model
    from tests.model.tiny_models import build_tiny_model

    path = tmp_path_factory.mktemp("server") / "tiny-qwen3"
    # Random weights; ids 0, 1, 2 are <|endoftext|>, <|im_start|>, <|im_end|> (trained first).
    build_tiny_model(path, "qwen3", seed=5, with_tokenizer=False, vocab_size=TOKENIZER_VOCAB + 16,
                     eos_token_id=2, max_position_embeddings=65536)
    build_server_tokenizer(path)
    return load_model(str(path), dtype="float32", device="cpu", name="tiny", progress=False)


@pytest.fixture(scope="session")
def start_server(tiny_server_model: Any) -> Iterator[Any]:
    """start_server(engine={...}, **server_keys) -> a running BackgroundServer, stopped at
    the end of the session (or by the test)."""
    from ignis.server.background import BackgroundServer
    from tests.server.server_harness import make_config

    started: list[Any] = []

    def start(*, engine: dict | None = None, **server: object) -> Any:
        srv = BackgroundServer(make_config(engine=engine, **server), tiny_server_model).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def srv(start_server: Any) -> Any:
    """The shared server: API key set, model 'tiny' alias 'fake-model', roomy engine."""
    return start_server()


# -- the scripted model ---------------------------------------------------------------


@pytest.fixture(scope="session")
def scripted_model() -> Any:
    """The scripted model (SmolLM2's tokenizer and template, replies from
    tests/clients/script.yaml): a deterministic agent for tool loops."""
    from ignis.model import load_model

    return load_model(kind="scripted", script=str(SCRIPT), device="cpu", name="scripted")


@pytest.fixture(scope="session")
def scripted_server(scripted_model: Any) -> Iterator[Any]:
    """A real server over the scripted model on 127.0.0.1: key server_harness.KEY; answers
    to 'scripted' and 'fake-model' (the name in Codex's recorded catalog)."""
    from ignis.server.background import BackgroundServer
    from tests.server.server_harness import make_config

    srv = BackgroundServer(make_config(engine={"num_kv_blocks": 8192, "max_num_seqs": 16}), scripted_model).start()
    yield srv
    srv.stop()
