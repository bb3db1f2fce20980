"""experiments/synthetic_gguf.py: random-weight GGUFs of real shapes. A tiny shape written
the same way loads in ignis with every tensor accounted for, carries a working tokenizer
padded to the shape's vocabulary, and decodes finite logits; the embedding table of any
block type is held in the file's blocks and looked up exactly. gpt-oss's shapes carry every
tensor and key llama.cpp's openai-moe loader reads, in its published MXFP4_MOE types."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from experiments.synthetic_gguf import (
    HARMONY_TOKENS,
    SHAPES,
    Shape,
    _copy_tokenizer,
    file_bytes,
    random_blocks,
    tensors,
    use_more_bits,
    weight_bytes_per_token,
    write,
)
from ignis.model.gguf_loader import config_from_gguf
from ignis.model.loader import load_model
from ignis.model.packed import BlockEmbedding, Q6Table, _Raw, _table
from ignis_kernels import cpu_native
from tests.model.paged_utils import flat_forward_logits

VOCAB = 49152 + 40  # SmolLM2's tokens and 40 padding control tokens


def test_q4_k_m_recipe_matches_llama_cpp() -> None:
    """Q6_K on the tied head and on the attn_v / ffn_down layers use_more_bits picks."""
    # llama.cpp's rule at 16 layers: 0, 1, 14, 15 and every third from 2 (4, 7, 10, 13)
    assert [i for i in range(16) if use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    types = {name: t for name, _, t in tensors(SHAPES["llama-3.2-1b"], "q4_k_m")}
    assert types["token_embd.weight"] == "Q6_K" and "output.weight" not in types
    assert types["blk.0.ffn_down.weight"] == "Q6_K" and types["blk.2.ffn_down.weight"] == "Q4_K"
    untied = {name: t for name, _, t in tensors(SHAPES["llama-3.1-8b"], "q4_k_m")}
    assert untied["token_embd.weight"] == "Q4_K" and untied["output.weight"] == "Q6_K"
    assert {t for _, _, t in tensors(SHAPES["llama-3.1-8b"], "q8_0")} == {"Q8_0", "F32"}


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.MXFP4])
def test_random_blocks_are_small_finite_weights(qtype: Q) -> None:
    raw = random_blocks(np.random.default_rng(0), (8, 512), qtype.name)
    w = gguf.quants.dequantize(raw, qtype).reshape(8, 512)
    assert np.isfinite(w).all() and 1e-3 < w.std() < 0.05 and abs(w.mean()) < 0.01


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q5_0])
def test_block_embedding_is_exact_at_file_size(qtype: Q) -> None:
    """Lookups in the file's blocks (Q6_K: its q6 form, which is also a large head's GEMM)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, (300, 512 // block * size), dtype=np.uint8)
    d_at = {Q.Q4_K: slice(0, 4), Q.Q6_K: slice(208, 210), Q.Q5_0: slice(0, 2)}[qtype]
    blocks = raw.reshape(300, -1, size)
    n = d_at.stop - d_at.start
    blocks[..., d_at] = rng.uniform(-0.1, 0.1, (300, blocks.shape[1], n // 2)).astype(np.float16).view(np.uint8)
    table = _table(_Raw(None, None, qtype=qtype, shape=(300, 512), data=raw), torch.float32)
    if qtype == Q.Q6_K and cpu_native.load():  # q6: the file's size, its fp16 d held as fp32
        assert isinstance(table, Q6Table) and table.nbytes == raw.nbytes + 2 * raw.shape[0] * 2
    else:
        assert isinstance(table, BlockEmbedding) and table.nbytes == raw.nbytes
    want = gguf.quants.dequantize(raw, qtype).reshape(300, 512)
    ids = torch.tensor([5, 0, 299, 5])
    np.testing.assert_array_equal(table(ids).numpy(), want[ids.numpy()])
    np.testing.assert_array_equal(table.dense().numpy(), want)


@pytest.mark.parametrize("shape", [
    Shape("llama", 256, 2, 4, 2, 64, 512, VOCAB, True, 500000.0),
    Shape("qwen3", 256, 2, 4, 2, 64, 512, VOCAB, False, 1000000.0, qk_norm=True),
], ids=["llama-tied", "qwen3-untied"])
def test_a_tiny_shape_loads_and_decodes(tmp_path: Path, shape: Shape) -> None:
    path = write(shape, "q4_k_m", tmp_path / "tiny.gguf", progress=False)
    reader = gguf.GGUFReader(path)
    assert len(reader.get_field("tokenizer.ggml.tokens").contents()) == VOCAB
    expected = sum(t.n_bytes for t in reader.tensors if not (t.name == "token_embd.weight" and not shape.tied))
    assert weight_bytes_per_token(path) == expected
    loaded = load_model(str(path), progress=False, weight_form="quantized", max_num_seqs=1)
    ids = loaded.tokenizer.encode("Hello, world")
    assert loaded.tokenizer.decode(ids) == "Hello, world"
    assert loaded.tokenizer.decode([VOCAB - 1], skip_special_tokens=True) == ""  # a padding control token
    logits = flat_forward_logits(loaded.model, [[ids, [ids[-1]]]])[0]
    assert logits.shape[-1] == VOCAB and torch.isfinite(logits).all()


# What llama.cpp's openai-moe loader (src/models/openai-moe.cpp) creates for each layer, all required.
GPT_OSS_LAYER = {"attn_norm.weight", "post_attention_norm.weight", "attn_sinks.weight",
                 *(f"{t}.{k}" for t in ("attn_q", "attn_k", "attn_v", "attn_output") for k in ("weight", "bias")),
                 *(f"{t}.{k}" for t in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
                   for k in ("weight", "bias"))}
TINY_GPT_OSS = Shape("gpt-oss", 256, 4, 4, 2, 64, 128, VOCAB, False, 150000.0, context=131072,
                     experts=4, experts_used=2, sliding_window=128, yarn=(32.0, 4096))


def test_gpt_oss_mxfp4_is_llama_cpps_mxfp4_moe() -> None:
    """Every tensor the loader requires; experts MXFP4, other matrices Q8_0 (the head and the
    embedding too), vectors and the router F32; no Q4_K_M (2880-wide rows)."""
    shape = SHAPES["gpt-oss-20b"]
    plan = {name: (dims, t) for name, dims, t in tensors(shape, "mxfp4")}
    want = {"token_embd.weight", "output_norm.weight", "output.weight",
            *(f"blk.{i}.{n}" for i in range(24) for n in GPT_OSS_LAYER)}
    assert set(plan) == want
    assert plan["blk.3.attn_sinks.weight"] == ((64,), "F32")
    assert plan["blk.0.ffn_gate_exps.weight"] == ((32, 2880, 2880), "MXFP4")
    assert plan["blk.0.ffn_down_exps.bias"] == ((32, 2880), "F32")
    assert plan["blk.0.ffn_gate_inp.weight"] == ((32, 2880), "F32")
    assert plan["blk.0.attn_q.weight"] == ((4096, 2880), "Q8_0") and plan["blk.0.attn_k.weight"][0] == (512, 2880)
    assert plan["output.weight"] == ((201088, 2880), "Q8_0") and plan["token_embd.weight"][1] == "Q8_0"
    with pytest.raises(ValueError, match="Q4_K"):
        tensors(shape, "q4_k_m")
    # the sizes ggml-org lists for its gpt-oss-20b-mxfp4.gguf (12.1 GB) and 120b (63.4 GB)
    assert abs(file_bytes(shape, "mxfp4") / 1e9 - 12.1) < 0.1
    assert abs(file_bytes(SHAPES["gpt-oss-120b"], "mxfp4") / 1e9 - 63.4) < 0.2


@pytest.mark.parametrize("name, total, active", [("gpt-oss-20b", 20.9e9, 3.6e9), ("gpt-oss-120b", 116.8e9, 5.1e9)])
def test_gpt_oss_shapes_have_the_model_cards_parameters(name: str, total: float, active: float) -> None:
    """The model card's counts: 20.9B total / 3.6B active, 116.8B / 5.1B (active: the routed
    share of the experts, the input embedding not counted)."""
    shape = SHAPES[name]
    sizes = {n: int(np.prod(dims)) for n, dims, _ in tensors(shape, "mxfp4")}
    share = shape.experts_used / shape.experts
    routed = sum(v * share if "_exps." in n else v for n, v in sizes.items() if n != "token_embd.weight")
    assert abs(sum(sizes.values()) / total - 1) < 0.01 and abs(routed / active - 1) < 0.02


def test_harmony_tokens_are_named_at_their_ids() -> None:
    class Recorder:  # a GGUFWriter's add_* calls, by name (no file: 201088 tokens read back slowly)
        def __init__(self) -> None:
            self.calls: dict[str, object] = {}

        def __getattr__(self, name: str):
            return lambda value: self.calls.__setitem__(name, value)

    w = Recorder()
    _copy_tokenizer(w, 201088, HARMONY_TOKENS)
    tokens, types = w.calls["add_token_list"], w.calls["add_token_types"]
    assert len(tokens) == len(types) == 201088 and len(set(tokens)) == len(tokens)
    assert all(tokens[i] == text for i, text in HARMONY_TOKENS.items() if text != "<|endoftext|>")
    assert tokens[0] == "<|endoftext|>"  # SmolLM2's own, not named twice
    assert all(types[i] == gguf.TokenType.CONTROL for i in HARMONY_TOKENS)


def test_a_tiny_gpt_oss_loads_and_decodes(tmp_path: Path) -> None:
    """A gpt-oss-shaped file in mxfp4: ignis reads its window, YaRN, experts and sinks, its
    packed CPU form runs the MXFP4 experts to finite logits close to the dequantized
    reference's, and a decode step reads the routed share of the experts."""
    shape = TINY_GPT_OSS
    path = write(shape, "mxfp4", tmp_path / "tiny-oss.gguf", progress=False)
    reader = gguf.GGUFReader(path)
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    assert kinds["blk.0.ffn_up_exps.weight"] == Q.MXFP4 and kinds["output.weight"] == Q.Q8_0
    assert kinds["blk.0.attn_sinks.weight"] == Q.F32
    c = config_from_gguf(reader)
    assert c.family == "gpt_oss" and c.hidden_act == "swiglu_oai" and c.attention_sinks
    assert c.sliding_window == 128
    assert c.layer_types == ("sliding_attention", "full_attention") * 2  # llama.cpp's period 2, layer 0 windowed
    assert c.num_experts == 4 and c.num_experts_per_tok == 2 and c.moe_intermediate_size == 128
    assert c.router_bias and c.expert_bias and c.attention_bias and c.o_proj_bias and not c.tie_word_embeddings
    assert c.rope_theta == 150000.0 and c.max_position_embeddings == 131072
    assert c.rope_scaling["rope_type"] == "yarn" and c.rope_scaling["factor"] == 32.0
    assert c.rope_scaling["original_max_position_embeddings"] == 4096

    share = shape.experts_used / shape.experts
    dense = sum(t.n_bytes for t in reader.tensors if "_exps." not in t.name and t.name != "token_embd.weight")
    experts = sum(t.n_bytes for t in reader.tensors if "_exps." in t.name)
    assert weight_bytes_per_token(path) == int(dense + experts * share)

    ids = [5, 17, 200, 3000, 45000, 12]
    got = {}
    for form in ("quantized", "float32"):
        loaded = load_model(str(path), progress=False, weight_form=form, max_num_seqs=1)
        assert loaded.config.layer_types == c.layer_types
        logits = flat_forward_logits(loaded.model, [[ids, [ids[-1]]]])[0]
        assert logits.shape == (len(ids) + 1, VOCAB) and torch.isfinite(logits).all()
        got[form] = logits
    # The packed form's activations are int8 per row: close to the reference, not equal.
    err = (got["quantized"] - got["float32"]).norm() / got["float32"].norm()
    assert err < 0.05, err
