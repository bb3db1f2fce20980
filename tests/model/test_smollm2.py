"""The embedded SmolLM2-135M-Instruct (Q4_1 GGUF) through ignis's own loader, tokenizer,
chat template and paged forward, against transformers loading the same GGUF file.

Measure: for each prompt, the fp32 logits that chose every generated token (the prefill's
last position, then each decode step through the paged cache) are stacked into [n, vocab]
and compared with transformers' logits at the same positions of one full forward over
prompt + answer, as max|ignis - hf| / max|hf| over that whole [n, vocab] block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ignis.model import LoadedModel, load_model
from ignis.model.chat_template import encode_chat
from ignis.model.embedded import smollm2_gguf_path
from tests.model.paged_utils import flat_forward_logits, hf_logits, rel_err
from tests.model.reference_generate import generate

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "What is 2 + 2?",
]
MAX_NEW = 24
TOL = 1e-3


@pytest.fixture(scope="module")
def ignis() -> LoadedModel:
    return load_model(progress=False)


@pytest.fixture(scope="module")
def hf() -> Any:
    from transformers import AutoModelForCausalLM

    path: Path = smollm2_gguf_path()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(ignis: LoadedModel) -> list[list[int]]:
    return [
        encode_chat(ignis.tokenizer, ignis.chat_template, [{"role": "user", "content": q}]) for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def batched(ignis: LoadedModel, prompts: list[list[int]]) -> Any:
    """All prompts prefilled in one flat forward, then decoded together (block_size 4)."""
    return generate(
        ignis.model, prompts, max_new_tokens=MAX_NEW, eos_token_ids=ignis.eos_token_ids,
        block_size=4, return_logits=True,
    )


def test_loaded(ignis: LoadedModel) -> None:
    assert ignis.name == "smollm2-135m" and ignis.kind == "gguf"
    assert ignis.config.family == "llama" and ignis.model.dtype == torch.float32
    im_end = ignis.tokenizer.token_to_id("<|im_end|>")
    assert im_end == 2 and im_end in ignis.eos_token_ids


def test_greedy_answers_match_transformers(
    ignis: LoadedModel, hf: Any, prompts: list[list[int]], batched: Any
) -> None:
    for prompt, tokens, reason in zip(prompts, batched.token_ids, batched.finish_reasons):
        ref = hf.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=list(ignis.eos_token_ids), pad_token_id=0,
        )[0, len(prompt):].tolist()
        assert tokens == ref
        assert reason == "stop"  # every answer here ends with <|im_end|> before MAX_NEW
    france = batched.token_ids[0][:-1]
    assert ignis.tokenizer.decode(france) == "The capital of France is Paris."
    assert "4" in ignis.tokenizer.decode(batched.token_ids[2])


def test_logits_match_transformers(hf: Any, prompts: list[list[int]], batched: Any) -> None:
    for prompt, tokens, logits in zip(prompts, batched.token_ids, batched.logits):
        full = hf_logits(hf, prompt + tokens)
        ref = full[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
        assert logits.shape == ref.shape
        assert rel_err(logits, ref) <= TOL


def test_flat_batch_equals_each_prompt_alone(ignis: LoadedModel, prompts: list[list[int]]) -> None:
    """Prompts of different lengths in ONE flat forward (block_size 4) give the final
    hidden states each gives alone (block_size 16), at every position."""
    together = flat_forward_logits(ignis.model, [[p] for p in prompts], block_size=4, hidden_only=True)
    for prompt, hidden in zip(prompts, together):
        alone = flat_forward_logits(ignis.model, [[prompt]], block_size=16, hidden_only=True)[0]
        assert rel_err(hidden, alone) <= 1e-5


def test_chat_helper(ignis: LoadedModel) -> None:
    from tests.model import reference_generate as generation

    [answer] = generation.chat(ignis, [[{"role": "user", "content": QUESTIONS[0]}]], max_new_tokens=MAX_NEW)
    assert answer.text == "The capital of France is Paris."
    assert answer.finish_reason == "stop" and answer.output_tokens == len(answer.token_ids)


def test_one_user_quantized_answer_is_greedy_exact() -> None:
    """The one-user form (`auto` at one sequence: int4 projections, the int8 head with its
    top candidates refined in fp32) gives fp32's greedy answer to the capital question."""
    from tests.model import reference_generate as generation

    loaded = load_model(progress=False, weight_form="auto", max_num_seqs=1)
    assert loaded.model.weight_form == "quantized" and loaded.model.head_op.wide is None
    [answer] = generation.chat(loaded, [[{"role": "user", "content": QUESTIONS[0]}]], max_new_tokens=MAX_NEW)
    assert answer.text == "The capital of France is Paris."
