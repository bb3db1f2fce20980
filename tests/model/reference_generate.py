"""A small generation loop over the paged cache: the engine-free reference of the model tests.

Each prompt gets a contiguous run of blocks sized for prompt + max_new_tokens; all
prompts are prefilled in one flat forward, then every unfinished sequence decodes
together, one token per step, until an eos id or max_new_tokens. The engine
(scheduler, block manager, runner) replaces this; it stays deliberately simple.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.kv_cache import KVCaches, allocate_kv_caches
from ignis.model.transformer import Transformer

if TYPE_CHECKING:
    from ignis.model.loader import LoadedModel


@dataclass
class GenerationOutput:
    # Generated ids per prompt, the stop token included when one ended the sequence.
    token_ids: list[list[int]]
    finish_reasons: list[str]  # "stop" (eos) or "length" (max_new_tokens)
    # With return_logits: per prompt, [len(token_ids[i]), vocab] fp32 logits that chose each token.
    logits: list[torch.Tensor] | None = field(default=None, repr=False)


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    if temperature <= 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def generate(
    model: Transformer,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 64,
    eos_token_ids: Sequence[int] = (),
    temperature: float = 0.0,
    seed: int | None = None,
    block_size: int = 16,
    return_logits: bool = False,
    on_token: Callable[[int, int], None] | None = None,
) -> GenerationOutput:
    """Greedy (temperature 0) or temperature-sampled continuation of each prompt.

    on_token(prompt_index, token_id) is called as each token is chosen (for streaming).
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs at least one non-empty prompt")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    device = model.device
    config = model.config
    lens = [len(p) for p in prompts]
    if max(lens) + max_new_tokens > config.max_position_embeddings:
        raise ValueError(
            f"prompt + max_new_tokens exceeds max_position_embeddings ({config.max_position_embeddings})"
        )
    # Contiguous blocks per sequence, sized for its final length.
    tables: list[list[int]] = []
    next_block = 0
    for n in lens:
        count = -(-(n + max_new_tokens) // block_size)
        tables.append(list(range(next_block, next_block + count)))
        next_block += count
    kv_caches: KVCaches = allocate_kv_caches(config, next_block, block_size, dtype=model.dtype, device=device)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    eos = set(eos_token_ids)

    out_ids: list[list[int]] = [[] for _ in prompts]
    out_logits: list[list[torch.Tensor]] = [[] for _ in prompts]
    reasons = ["length"] * len(prompts)

    # Prefill: every prompt in one flat forward; logits only at each prompt's last token.
    meta, positions = AttentionMetadata.build(
        query_lens=lens, seq_lens=lens, block_tables=tables, block_size=block_size, device=device
    )
    input_ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=device)
    hidden = model(input_ids, positions, kv_caches, meta)
    logits = model.compute_logits(hidden, meta.query_start_loc[1:].long() - 1)
    active = list(range(len(prompts)))
    cur_len = list(lens)

    while True:
        tokens = _pick(logits, temperature, generator).tolist()
        still: list[int] = []
        for row, i in enumerate(active):
            out_ids[i].append(tokens[row])
            if return_logits:
                out_logits[i].append(logits[row].cpu())
            if on_token is not None:
                on_token(i, tokens[row])
            if tokens[row] in eos:
                reasons[i] = "stop"
            elif len(out_ids[i]) < max_new_tokens:
                still.append(i)
        if not still:
            break
        # Decode: the last token of each unfinished sequence, all in one step.
        for i in still:
            cur_len[i] += 1
        meta, positions = AttentionMetadata.build(
            query_lens=[1] * len(still),
            seq_lens=[cur_len[i] for i in still],
            block_tables=[tables[i] for i in still],
            block_size=block_size,
            device=device,
        )
        input_ids = torch.tensor([out_ids[i][-1] for i in still], dtype=torch.int64, device=device)
        hidden = model(input_ids, positions, kv_caches, meta)
        logits = model.compute_logits(hidden)
        active = still

    return GenerationOutput(
        token_ids=out_ids,
        finish_reasons=reasons,
        logits=[torch.stack(rows) for rows in out_logits] if return_logits else None,
    )


@dataclass
class ChatAnswer:
    text: str  # the reply, decoded without its stop token
    token_ids: list[int]  # generated ids, stop token included when one ended the reply
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    output_tokens: int


def chat(
    loaded: LoadedModel,
    conversations: Sequence[list[dict[str, Any]]],
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    seed: int | None = None,
    block_size: int = 16,
    tools: list[dict[str, Any]] | None = None,
    enable_thinking: bool | None = None,
    on_token: Callable[[int, int], None] | None = None,
) -> list[ChatAnswer]:
    """Answer each conversation (a list of chat messages) through the model's chat template."""
    from ignis.model.chat_template import encode_chat

    prompts = [
        encode_chat(loaded.tokenizer, loaded.chat_template, list(messages), tools=tools, enable_thinking=enable_thinking)
        for messages in conversations
    ]
    out = generate(
        loaded.model,
        prompts,
        max_new_tokens=max_new_tokens,
        eos_token_ids=loaded.eos_token_ids,
        temperature=temperature,
        seed=seed,
        block_size=block_size,
        on_token=on_token,
    )
    answers = []
    for prompt, ids, reason in zip(prompts, out.token_ids, out.finish_reasons):
        body = ids[:-1] if reason == "stop" else ids
        answers.append(
            ChatAnswer(
                text=loaded.tokenizer.decode(body),
                token_ids=ids,
                finish_reason=reason,
                prompt_tokens=len(prompt),
                output_tokens=len(ids),
            )
        )
    return answers
