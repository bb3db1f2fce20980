"""experiments/synthetic_gguf.py: random-weight GGUFs of real shapes. A tiny shape written
the same way loads in ignis with every tensor accounted for, carries a working tokenizer
padded to the shape's vocabulary, and decodes finite logits; the embedding table of any
block type is held in the file's blocks and looked up exactly."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from experiments.synthetic_gguf import SHAPES, Shape, random_blocks, tensors, use_more_bits, weight_bytes_per_token, write
from ignis.model.loader import load_model
from ignis.model.packed import BlockEmbedding, _Raw, _table
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


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0])
def test_random_blocks_are_small_finite_weights(qtype: Q) -> None:
    raw = random_blocks(np.random.default_rng(0), (8, 512), qtype.name)
    w = gguf.quants.dequantize(raw, qtype).reshape(8, 512)
    assert np.isfinite(w).all() and 1e-3 < w.std() < 0.05 and abs(w.mean()) < 0.01


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q5_0])
def test_block_embedding_is_exact_at_file_size(qtype: Q) -> None:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, (300, 512 // block * size), dtype=np.uint8)
    d_at = {Q.Q4_K: slice(0, 4), Q.Q6_K: slice(208, 210), Q.Q5_0: slice(0, 2)}[qtype]
    blocks = raw.reshape(300, -1, size)
    n = d_at.stop - d_at.start
    blocks[..., d_at] = rng.uniform(-0.1, 0.1, (300, blocks.shape[1], n // 2)).astype(np.float16).view(np.uint8)
    table = _table(_Raw(None, None, qtype=qtype, shape=(300, 512), data=raw), torch.float32)
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
