"""ignis's forward equals transformers' on tiny random Llama / Qwen2 / Qwen3 checkpoints.

Each case is a checkpoint directory written by transformers itself (save_pretrained,
safetensors, sharded for some), loaded by ignis's HF loader and by transformers
(fp32, eager attention). Logits are compared at every position as
max|ignis - hf| / max|hf| <= 1e-4, for a ragged batch in one flat forward, for chunked
prefill over a cached prefix, and for prefill + decode steps through the paged cache
(block_size 4, so every sequence spans several blocks).
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ignis.model.hf_loader import config_from_hf_dict, iter_hf_weights, read_hf_config
from ignis.model.loader import build_model
from ignis.model.transformer import Transformer
from tests.model.paged_utils import flat_forward_logits, hf_logits, rel_err
from tests.model.reference_generate import generate
from tests.model.tiny_models import build_tiny_model

TOL = 1e-4
LLAMA3 = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}

CASES: dict[str, dict[str, Any]] = {
    # untied head, GQA 2:1, llama3 rope, sharded safetensors
    "llama-untied-gqa-llama3-sharded": dict(family="llama", num_heads=4, num_kv_heads=2, rope_scaling=LLAMA3, sharded=True),
    # tied head, MHA, linear rope, Llama's attention_bias (q/k/v/o) and mlp_bias
    "llama-tied-mha-linear-bias": dict(
        family="llama", tie_word_embeddings=True, num_heads=4, num_kv_heads=4,
        rope_scaling={"rope_type": "linear", "factor": 2.0}, attention_bias=True, mlp_bias=True,
    ),
    # tied head, MQA (4:1), yarn rope (attention factor on cos/sin), q/k/v bias
    "qwen2-tied-mqa-yarn": dict(family="qwen2", tie_word_embeddings=True, num_heads=4, num_kv_heads=1, rope_scaling=YARN),
    # sliding window on layers >= max_window_layers only
    "qwen2-sliding-window": dict(
        family="qwen2", num_layers=3, use_sliding_window=True, sliding_window=5, max_window_layers=1,
    ),
    # untied, head_dim 32 != hidden / heads, per-head q/k RMSNorm, sharded
    "qwen3-untied-headdim-sharded": dict(family="qwen3", num_heads=4, num_kv_heads=2, head_dim=32, sharded=True),
    # tied, GQA 3:1, dynamic rope (plain within max_position_embeddings), larger theta
    "qwen3-tied-gqa3-dynamic": dict(
        family="qwen3", tie_word_embeddings=True, num_heads=6, num_kv_heads=2, hidden_size=96, head_dim=16,
        rope_theta=1e6, rope_scaling={"rope_type": "dynamic", "factor": 2.0},
    ),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """Build (once per module) and load a case: its directory, ignis's model and HF's."""
    from transformers import AutoModelForCausalLM

    cache: dict[str, dict[str, Any]] = {}

    def get(name: str) -> dict[str, Any]:
        if name not in cache:
            spec = dict(CASES[name])
            path = build_tiny_model(tmp_path_factory.mktemp(name), seed=len(name), **spec)
            ignis = build_model(read_hf_config(path), iter_hf_weights(path))
            hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
            cache[name] = {"name": name, "spec": spec, "path": path, "ignis": ignis, "hf": hf.eval()}
        return cache[name]

    return get


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest, built: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    return built(request.param)


def _prompts(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def test_config_parsed(case: dict[str, Any]) -> None:
    spec, c = case["spec"], case["ignis"].config
    assert c.family == spec["family"]
    assert c.tie_word_embeddings == spec.get("tie_word_embeddings", False)
    assert c.num_kv_heads == spec.get("num_kv_heads", 2)
    assert c.attention_bias == (spec["family"] == "qwen2" or spec.get("attention_bias", False))
    assert c.qk_norm == (spec["family"] == "qwen3")
    assert c.head_dim == spec.get("head_dim", c.hidden_size // c.num_heads)
    if "rope_scaling" in spec:
        assert c.rope_scaling is not None and c.rope_scaling["rope_type"] == spec["rope_scaling"]["rope_type"]
    else:
        assert c.rope_scaling is None
    assert c.sliding_window == (spec["sliding_window"] if spec.get("use_sliding_window") else None)
    assert len(c.eos_token_ids) == 2  # generation_config.json lists <|im_end|> and <|endoftext|>
    if c.tie_word_embeddings:
        assert case["ignis"].lm_head is case["ignis"].embed_tokens


def test_ragged_batch_matches_hf(case: dict[str, Any]) -> None:
    """Four prompts of different lengths (1 to 19 tokens) in ONE flat prefill forward."""
    model: Transformer = case["ignis"]
    prompts = _prompts(model.config.vocab_size, [7, 1, 19, 12], seed=1)
    got = flat_forward_logits(model, [[p] for p in prompts], block_size=4)
    for prompt, logits in zip(prompts, got):
        ref = hf_logits(case["hf"], prompt)
        assert rel_err(logits, ref) <= TOL


def test_chunked_prefill_and_decode_match_hf(case: dict[str, Any]) -> None:
    """Prefill in chunks over a cached prefix, then decode steps, two sequences batched:
    every step's logits equal a single full forward over the whole sequence (ignis and HF)."""
    model: Transformer = case["ignis"]
    a, b = _prompts(model.config.vocab_size, [30, 23], seed=2)
    # steps: chunk of 9 / 6, chunk of 7 / 5 (q_len < seq_len), then single-token decodes
    chunks = [
        [a[:9], a[9:16]] + [[t] for t in a[16:]],
        [b[:6], b[6:11]] + [[t] for t in b[11:]] + [[]] * 2,  # b idles (q_len 0) at the end
    ]
    got = flat_forward_logits(model, chunks, block_size=4)
    whole = flat_forward_logits(model, [[a], [b]], block_size=4)
    for seq, logits, full in zip((a, b), got, whole):
        ref = hf_logits(case["hf"], seq)
        assert logits.shape == ref.shape
        assert rel_err(logits, ref) <= TOL
        assert rel_err(logits, full) <= TOL


def test_sliding_window_is_exercised(built: Callable[[str], dict[str, Any]]) -> None:
    """Without the window the sliding-window checkpoint must give different logits
    (so the comparisons above really check the window, not a no-op)."""
    case = built("qwen2-sliding-window")
    assert [layer.self_attn.sliding_window for layer in case["ignis"].layers] == [None, 5, 5]
    model: Transformer = case["ignis"]
    (prompt,) = _prompts(model.config.vocab_size, [16], seed=3)
    windowed = flat_forward_logits(model, [[prompt]])[0]
    saved = [layer.self_attn.sliding_window for layer in model.layers]
    try:
        for layer in model.layers:
            layer.self_attn.sliding_window = None
        full = flat_forward_logits(model, [[prompt]])[0]
    finally:
        for layer, w in zip(model.layers, saved):
            layer.self_attn.sliding_window = w
    assert rel_err(windowed, full) > 1e-3


def test_greedy_generation_matches_hf(case: dict[str, Any]) -> None:
    model: Transformer = case["ignis"]
    prompts = _prompts(model.config.vocab_size, [5, 11], seed=4)
    out = generate(model, prompts, max_new_tokens=8, block_size=4)
    for prompt, tokens in zip(prompts, out.token_ids):
        ref = case["hf"].generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0,
        )[0, len(prompt):].tolist()
        assert tokens == ref


def test_config_transformers4_forms() -> None:
    """config.json as transformers 4 wrote it: rope_theta + rope_scaling ("type" or
    "rope_type"), Qwen2's sliding_window present but disabled, eos ids as a list."""
    llama = {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    }
    c = config_from_hf_dict(llama)
    assert (c.family, c.head_dim, c.rope_theta, c.tie_word_embeddings) == ("llama", 64, 500000.0, True)
    assert c.rope_scaling == {"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0,
                              "low_freq_factor": 1.0, "original_max_position_embeddings": 8192}
    assert c.eos_token_ids == (128001, 128008, 128009)
    assert config_from_hf_dict(llama, {"eos_token_id": 7}).eos_token_ids == (7,)

    qwen2 = {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
        "sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 21,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        "tie_word_embeddings": True, "eos_token_id": 151645,
    }
    c = config_from_hf_dict(qwen2)
    assert (c.family, c.head_dim, c.attention_bias, c.sliding_window) == ("qwen2", 64, True, None)
    assert c.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}

    with pytest.raises(NotImplementedError):
        config_from_hf_dict({**llama, "model_type": "gpt2"})


def test_sharded_index_is_used(built: Callable[[str], dict[str, Any]]) -> None:
    case = built("qwen3-untied-headdim-sharded")
    index = json.loads((Path(case["path"]) / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1


def test_bfloat16_runs_close_to_fp32_reference(built: Callable[[str], dict[str, Any]]) -> None:
    """bf16 weights, activations and cache (the CUDA default), here on CPU: finite and within
    bf16 noise of transformers' fp32 logits (its own bf16 run is ~2e-2 off)."""
    case = built("qwen3-untied-headdim-sharded")
    model = build_model(read_hf_config(case["path"]), iter_hf_weights(case["path"]), dtype=torch.bfloat16)
    (prompt,) = _prompts(model.config.vocab_size, [20], seed=5)
    chunked = flat_forward_logits(model, [[prompt[:9], prompt[9:]]], block_size=4)[0]
    assert torch.isfinite(chunked).all()
    assert rel_err(chunked, hf_logits(case["hf"], prompt)) <= 6e-2


def test_headless_untied_checkpoint_is_tied(built: Callable[[str], dict[str, Any]], tmp_path: Path) -> None:
    """A config that says untied but ships no lm_head.weight gets the tied head (with a warning)."""
    import shutil

    source = Path(built("llama-tied-mha-linear-bias")["path"])
    shutil.copytree(source, tmp_path / "m")
    config_file = tmp_path / "m" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "tie_word_embeddings": False}))
    assert read_hf_config(tmp_path / "m").tie_word_embeddings


def test_load_weights_rejects_bad_checkpoints(built: Callable[[str], dict[str, Any]]) -> None:
    path = built("qwen2-tied-mqa-yarn")["path"]
    config = read_hf_config(path)
    weights = dict(iter_hf_weights(path))
    with pytest.raises(KeyError, match="missing"):
        build_model(config, [(n, t) for n, t in weights.items() if n != "layers.1.self_attn.k_proj.bias"])
    with pytest.raises(KeyError, match="unexpected"):
        build_model(config, [*weights.items(), ("layers.0.mlp.experts.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        build_model(config, [(n, t.T if n == "layers.0.mlp.up_proj.weight" else t) for n, t in weights.items()])


@pytest.mark.parametrize("name", ["qwen2-sliding-window", "qwen3-untied-headdim-sharded"])
def test_triton_kernels_match_reference(built: Callable[[str], dict[str, Any]], name: str) -> None:
    """The forward through the Triton kernels (interpreted on CPU, as conftest sets up):
    the strided q/k/v views, int32/int64 metadata and hints the model passes fit their contract."""
    import ignis_kernels

    model: Transformer = built(name)["ignis"]
    a, b = _prompts(model.config.vocab_size, [13, 6], seed=6)
    chunks = [[a[:7], a[7:12], a[12:]], [b[:3], b[3:5], b[5:]]]
    previous = ignis_kernels.get_backend()
    try:
        ignis_kernels.set_backend("torch")
        reference = flat_forward_logits(model, chunks)
        ignis_kernels.set_backend("triton")
        got = flat_forward_logits(model, chunks)
    finally:
        ignis_kernels.set_backend(previous)
    for x, y in zip(got, reference):
        assert rel_err(x, y) <= 1e-5
