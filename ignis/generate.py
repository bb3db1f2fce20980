"""Offline generation through the engine, for experiments.

    python -m ignis.generate +model=smollm2-135m prompt="Write a haiku about fire"
    python -m ignis.generate +model=hf model.path=/models/Qwen3-0.6B max_new_tokens=256 engine.max_num_seqs=8

streams the answer (greedy unless temperature=...) to stdout and logs prompt / cached / generated tokens and
tokens per second. From Python, the same engine:

    from ignis.generate import build_engine, generate
    engine = build_engine(loaded)                        # or LLMEngine(loaded, EngineConfig(...))
    [c] = generate(engine, ["What is 2 + 2?"], SamplingParams.greedy(32))
    c.text, c.token_ids, c.usage

A prompt is a string (one user message, rendered by the model's chat template), a list
of chat messages, or a list of token ids (used as is).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from ignis.config import EngineConfig, IgnisConfig, config_object, register
from ignis.engine import Completion, LLMEngine, SamplingParams
from ignis.model import LoadedModel

log = logging.getLogger("ignis.generate")

Prompt = str | Sequence[int] | Sequence[dict[str, Any]]


@dataclass
class GenerateConfig(IgnisConfig):
    """configs/generate.yaml: the whole ignis configuration plus one generation's keys."""

    prompt: str = "What is the capital of France?"  # one user message, through the chat template
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    seed: int | None = None


register()
ConfigStore.instance().store(name="generate_schema", node=GenerateConfig)


def build_engine(loaded: LoadedModel, config: EngineConfig | None = None) -> LLMEngine:
    return LLMEngine(loaded, config or EngineConfig())


def encode_prompt(loaded: LoadedModel, prompt: Prompt) -> list[int]:
    from ignis.model.chat_template import encode_chat

    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    items = list(prompt)
    if items and isinstance(items[0], dict):
        return encode_chat(loaded.tokenizer, loaded.chat_template, items)  # type: ignore[arg-type]
    return [int(t) for t in items]  # type: ignore[arg-type]


def generate(
    engine: LLMEngine,
    prompts: Sequence[Prompt],
    params: SamplingParams | Sequence[SamplingParams] | None = None,
) -> list[Completion]:
    """Run every prompt to completion, all in flight together; results in prompt order."""
    ids = [encode_prompt(engine.loaded, p) for p in prompts]
    return engine.generate(ids, params)


def run(cfg: GenerateConfig) -> int:
    from ignis.model import load_model_from_config

    # Tensor parallelism: the engine loads each rank's shard itself; no full copy here.
    loaded = load_model_from_config(cfg.model, cfg.engine.max_num_seqs, weights=cfg.engine.tensor_parallel_size == 1)
    engine = build_engine(loaded, cfg.engine)
    prompt = encode_prompt(loaded, cfg.prompt)
    params = SamplingParams(max_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed)
    engine.add_request("cli", prompt, params)
    start = time.perf_counter()
    first_token_at: float | None = None
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.token_ids and first_token_at is None:
                first_token_at = time.perf_counter()
            sys.stdout.write(out.text)
            sys.stdout.flush()
            if out.finished:
                final = out
    elapsed = time.perf_counter() - start
    print()
    if final is None or final.usage is None:
        return 1
    if final.error:
        print(f"ignis: {final.error}", file=sys.stderr)
        return 1
    u = final.usage
    decode_time = elapsed - ((first_token_at or start) - start)
    log.info(
        "%d prompt tokens (%d cached), %d generated in %.2f s (first token after %.2f s; %.1f tok/s decode), "
        "finish reason %s",
        u.prompt_tokens, u.cached_tokens, u.output_tokens, elapsed, (first_token_at or start) - start,
        (u.output_tokens - 1) / decode_time if u.output_tokens > 1 and decode_time > 0 else 0.0,
        final.finish_reason.value if final.finish_reason else None,
    )
    return 0


@hydra.main(version_base="1.3", config_path="../configs", config_name="generate")
def main(dcfg: DictConfig) -> int:
    cfg: GenerateConfig = config_object(dcfg)
    sys.exit(run(cfg))


if __name__ == "__main__":
    main()
