"""The GGUF loader: metadata, dequantization, llama.cpp's Q/K permutation, name mapping.

Tiny GGUFs are written here from tiny HF checkpoints the way llama.cpp's converter
writes them (permuted Q/K for "llama", quantized 2-D weights), then loaded by ignis and
by transformers (which dequantizes with the same gguf package). Logits are compared as
max|ignis - ref| / max|ref| over every position of a 37-token prompt.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from ignis.model.embedded import smollm2_gguf_path
from ignis.model.gguf_loader import config_from_gguf, iter_gguf_weights, unpermute_rope_rows
from ignis.model.hf_loader import iter_hf_weights, read_hf_config
from ignis.model.loader import build_model
from tests.model.paged_utils import flat_forward_logits, hf_logits, rel_err
from tests.model.tiny_models import build_tiny_gguf, build_tiny_model, llama_cpp_permute

TOL = 1e-4
PROMPT = list(range(3, 40))


def _ignis_from_gguf(path: Path):
    reader = gguf.GGUFReader(path)
    config = config_from_gguf(reader)
    return build_model(config, iter_gguf_weights(reader, config))


def test_unpermute_inverts_llama_cpp_permute() -> None:
    rng = np.random.default_rng(0)
    for n_head, shape in ((4, (64, 8)), (2, (32, 8)), (3, (48,))):
        w = rng.standard_normal(shape).astype(np.float32)
        assert np.array_equal(unpermute_rope_rows(llama_cpp_permute(w, n_head), n_head), w)
        assert not np.array_equal(llama_cpp_permute(w, n_head), w)


@pytest.mark.parametrize(
    "family, kwargs, qtypes",
    [
        # GQA 2:1, permuted Q/K, untied head stored BF16, quantized blocks
        ("llama", dict(num_heads=4, num_kv_heads=2), {"embd": Q.Q8_0, "attn": Q.Q4_1, "ffn": Q.Q5_0, "output": Q.BF16}),
        # MQA, q/k/v bias, tied head (no output.weight), not permuted
        ("qwen2", dict(num_heads=4, num_kv_heads=1, tie_word_embeddings=True), {"embd": Q.F16, "attn": Q.Q4_0, "ffn": Q.Q8_0}),
    ],
)
def test_quantized_gguf_matches_transformers(tmp_path: Path, family: str, kwargs: dict, qtypes: dict) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = build_tiny_model(tmp_path / family, family, **kwargs)
    path = build_tiny_gguf(model_dir, tmp_path / f"{family}.gguf", qtypes)
    ignis = _ignis_from_gguf(path)
    assert ignis.config.family == family
    assert ignis.config.tie_word_embeddings == kwargs.get("tie_word_embeddings", False)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    assert rel_err(flat_forward_logits(ignis, [[PROMPT]])[0], hf_logits(hf, PROMPT)) <= TOL


@pytest.mark.parametrize(
    "family, kwargs",
    [
        # llama.cpp-permuted Q/K rows, GQA: un-permuting must give back the HF weights exactly
        ("llama", dict(num_heads=4, num_kv_heads=2)),
        # qk-norm tensors and key_length (head_dim 32 != hidden / heads); transformers' own
        # GGUF reader ignores key_length for Qwen3, so safetensors is the reference here
        ("qwen3", dict(head_dim=32)),
    ],
)
def test_f32_gguf_equals_safetensors(tmp_path: Path, family: str, kwargs: dict) -> None:
    """The same weights as F32 GGUF and as safetensors give bit-identical logits."""
    model_dir = build_tiny_model(tmp_path / family, family, **kwargs)
    ignis = _ignis_from_gguf(build_tiny_gguf(model_dir, tmp_path / f"{family}.gguf"))
    reference = build_model(read_hf_config(model_dir), iter_hf_weights(model_dir))
    assert ignis.config.head_dim == reference.config.head_dim
    assert ignis.config.qk_norm == (family == "qwen3")
    got = flat_forward_logits(ignis, [[PROMPT]])[0]
    assert torch.equal(got, flat_forward_logits(reference, [[PROMPT]])[0])


def test_smollm2_metadata() -> None:
    config = config_from_gguf(gguf.GGUFReader(smollm2_gguf_path()))
    assert (config.family, config.num_layers, config.hidden_size) == ("llama", 30, 576)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (9, 3, 64)
    assert (config.vocab_size, config.intermediate_size, config.rope_theta) == (49152, 1536, 100000.0)
    assert config.tie_word_embeddings and config.rope_scaling is None
    assert config.max_position_embeddings == 8192
    assert config.eos_token_ids == (2,) and config.bos_token_id == 1


def test_load_model_hf_dir_and_gguf_agree(tmp_path: Path) -> None:
    """load_model end to end (weights, tokenizer, chat template, eos ids) on one tiny
    checkpoint as an HF directory and as a GGUF file: the same chat gives the same ids."""
    from tests.model import reference_generate as generation

    from ignis.model import load_model

    model_dir = build_tiny_model(tmp_path / "tiny-qwen3", "qwen3", head_dim=16)
    gguf_path = build_tiny_gguf(model_dir, tmp_path / "tiny-qwen3.gguf")
    from_dir = load_model(str(model_dir), progress=False)
    from_gguf = load_model(str(gguf_path), progress=False, name="custom")
    assert (from_dir.kind, from_dir.name) == ("hf", "tiny-qwen3")
    assert (from_gguf.kind, from_gguf.name) == ("gguf", "custom")
    im_end = from_dir.tokenizer.token_to_id("<|im_end|>")
    assert im_end in from_dir.eos_token_ids and im_end in from_gguf.eos_token_ids
    chats = [[{"role": "user", "content": "What is the capital of France?"}], [{"role": "user", "content": "hi"}]]
    a = generation.chat(from_dir, chats, max_new_tokens=6, enable_thinking=False)
    b = generation.chat(from_gguf, chats, max_new_tokens=6, enable_thinking=False)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.prompt_tokens for x in a] == [x.prompt_tokens for x in b]
