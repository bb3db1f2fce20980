"""The native CPU decode step (ignis_kernels/cpu/decode.cpp via ignis/model/native_decode.py)
against the eager forward it replaces, on tiny GGUF models in each packed form it serves.

Tolerance, documented: the native step runs the same GEMMs on the same bf16 inputs and
the same fp32 arithmetic between them, but sums in another order (and its exp is its
own, within 2 ulp), so an activation can
land one fp32 ulp away and then round to the other bf16 neighbour before a GEMM. Measured
on SmolLM2 (30 layers): each layer alone matches eager to <= 2e-5 relative, most exactly;
the model as a whole amplifies such flips the same way it amplifies any 1e-5 perturbation
of eager's own hidden state (~1% of the final hidden state after 20 layers). On the tiny
models here most steps agree to 2e-7 of the largest hidden value, and a step with such a
flip to 1e-3..1.3e-2 (measured over 10-12 prompt sets per case, with an fp32 and a bf16
cache alike; a bound of 1e-3 failed half of qwen3's prompt sets with either). So every
row of every step must be within TOL, and the median one within TYPICAL: a flip is rare,
a broken step (a key missed, a wrong scale or window) moves every row (a scale 5% off:
3e-2..7e-2 everywhere).

Each case runs over an fp32 and a bf16 KV cache (engine.kv_cache_dtype) with the same
tolerance: both paths round K/V to bf16 the same way (to nearest even, as torch's cast)
and attend in fp32. test_bf16_cache_holds_torchs_rounding checks the rounding exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from ignis.config import EngineConfig
from ignis.engine import LLMEngine, SamplingParams
from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.kv_cache import allocate_kv_caches
from ignis.model.lm_head import NARROW_ROWS
from ignis.model.hf_loader import read_hf_config
from ignis.model.loader import load_model
from ignis.model.native_decode import NativeDecoder, _linears, unsupported
from ignis.model.weight_plan import UnsupportedWeightForm, plan_weights
from ignis_kernels import cpu_native, cpu_platform
from ignis_kernels.attention_cpu_native import NativeCpuAttention
from tests.model.paged_utils import block_tables_for, rel_err
from tests.model.llamacpp_convert import convert, converter_dir
from tests.model.tiny_models import build_tiny_gguf, build_tiny_model, build_tiny_spm

TOL = 3e-2  # any row of any step
# The median row; 5e-4 where a GEMM rounds x to int16 per group of 32 (ignis_kernels/cpu/quant_gemm.h:
# every form on the AVX2 tier, the q8 form wherever AVX2 is), as a last-bit difference between
# the two paths' inputs can move a rounding by 2^-16 of the group's largest.
# A bf16 KV cache can round such a difference up a bf16 step in a key: 2e-3 there.
TYPICAL = 1e-4 if cpu_platform.current().level == "portable" else 5e-4
TYPICAL_BF16_KV = 1e-4 if cpu_platform.current().level == "portable" else 2e-3
BLOCK = 4
KV_DTYPES = pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["kv_fp32", "kv_bf16"])
# What this machine (or IGNIS_CPU_CAPS) builds: 4-bit blocks as int4 GEMMs (avx512) or int8.
PLAN = plan_weights("mixed", kind="gguf", device=torch.device("cpu"), max_num_seqs=64)


@pytest.fixture(scope="module", autouse=True)
def _native_op() -> None:
    if not cpu_native.load():
        pytest.skip("no native CPU decode op on this machine (no C++ compiler?)")


def _gguf(tmp_path: Path, family: str, qtypes: dict, **kwargs) -> str:
    model_dir = build_tiny_model(tmp_path / family, family, intermediate_size=128, **kwargs)
    return str(build_tiny_gguf(model_dir, tmp_path / f"{family}.gguf", qtypes))


def _same_kv(eager_kv, native_kv, slots: torch.Tensor) -> None:
    """The K/V rows a step wrote (at `slots`) agree; then the native cache is reset to
    eager's, so that every step starts from the same cache (a flip's difference would
    otherwise compound over the steps)."""
    for kv, kv2 in zip(eager_kv, native_kv, strict=True):
        for want, got in zip(kv, kv2, strict=True):
            assert got.dtype == want.dtype
            assert rel_err(got.flatten(0, 1)[slots], want.flatten(0, 1)[slots]) < TOL
            got.copy_(want)


@torch.inference_mode()
def _decode_both(model, native: NativeDecoder, prompts: list[list[int]], steps: int,
                 kv_dtype: torch.dtype = torch.float32) -> None:
    """Prefill each prompt eagerly, then decode `steps` tokens for all of them together,
    once eagerly and once natively, each on its own copy of a `kv_dtype` cache, feeding
    both the eager path's greedy tokens. Checks the native hidden rows' relative errors
    against TOL and TYPICAL (see the docstring)."""
    lengths = [len(p) + steps for p in prompts]
    tables = block_tables_for(lengths, BLOCK)
    blocks = max(b for t in tables for b in t) + 1
    eager_kv = allocate_kv_caches(model.config, blocks, BLOCK, dtype=kv_dtype)
    native_kv = allocate_kv_caches(model.config, blocks, BLOCK, dtype=kv_dtype)
    meta, pos = AttentionMetadata.build(query_lens=[len(p) for p in prompts], seq_lens=[len(p) for p in prompts],
                                        block_tables=tables, block_size=BLOCK)
    hidden = model(torch.tensor([t for p in prompts for t in p]), pos, eager_kv, meta)
    for (k, v), (k2, v2) in zip(eager_kv, native_kv, strict=True):
        k2.copy_(k)
        v2.copy_(v)
    last = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    ids = model.compute_logits(hidden, last).argmax(-1)
    lens = [len(p) for p in prompts]
    errors: list[float] = []
    for _ in range(steps):
        lens = [n + 1 for n in lens]
        meta, pos = AttentionMetadata.build(query_lens=[1] * len(prompts), seq_lens=lens, block_tables=tables,
                                            block_size=BLOCK)
        want = model(ids, pos, eager_kv, meta)
        got = native(ids, pos, native_kv, meta.slot_mapping, meta.block_tables, meta.seq_lens)
        assert got.shape == want.shape
        errors += [rel_err(g, w) for g, w in zip(got, want, strict=True)]
        _same_kv(eager_kv, native_kv, meta.slot_mapping)
        ids = model.compute_logits(want).argmax(-1)
    typical = TYPICAL_BF16_KV if kv_dtype == torch.bfloat16 else TYPICAL
    assert max(errors) < TOL and torch.tensor(errors).median() < typical, errors


@pytest.mark.parametrize(
    "family, kwargs, qtypes, form",
    [
        # int4 GEMMs (Q4_1 attention, Q4_0 MLP), permuted Q/K rows, GQA 2:1; mixed: the int4 part
        ("llama", dict(num_heads=4, num_kv_heads=2, max_position_embeddings=1024),
         {"embd": Q.Q8_0, "attn": Q.Q4_1, "ffn": Q.Q4_0, "output": Q.Q8_0}, "quantized"),
        ("llama", dict(num_heads=4, num_kv_heads=2, max_position_embeddings=1024),
         {"embd": Q.Q8_0, "attn": Q.Q4_1, "ffn": Q.Q4_0, "output": Q.Q8_0}, "mixed"),
        # q8 (Q8_0 exactly) with q/k/v biases, one kv head, a tied head
        ("qwen2", dict(num_heads=4, num_kv_heads=1, tie_word_embeddings=True, max_position_embeddings=1024),
         {"embd": Q.F16, "attn": Q.Q8_0, "ffn": Q.Q8_0}, "quantized"),
        ("llama", dict(num_heads=4, num_kv_heads=2, max_position_embeddings=1024),
         {"embd": Q.Q8_0, "attn": Q.Q5_0, "ffn": Q.Q5_1}, "mixed"),
        # per-head q/k RMSNorm
        ("qwen3", dict(num_heads=4, num_kv_heads=2, max_position_embeddings=1024),
         {"embd": Q.Q8_0, "attn": Q.Q4_0, "ffn": Q.Q4_1}, "quantized"),
        # head dims the attention unrolls (64, 128), wider than hidden / heads (heads x dim != hidden)
        ("qwen3", dict(num_heads=2, num_kv_heads=1, head_dim=64, max_position_embeddings=1024),
         {"embd": Q.Q8_0, "attn": Q.Q4_0, "ffn": Q.Q4_0}, "mixed"),
        ("qwen2", dict(num_heads=2, num_kv_heads=1, head_dim=128, max_position_embeddings=1024),
         {"embd": Q.Q8_0, "attn": Q.Q4_1, "ffn": Q.Q4_1}, "quantized"),
        # int4 and int8 GEMMs in one model (as Q4_K_M files keep some tensors at Q6_K; the
        # tiny rows are too short for its 256-wide blocks: F16, requantized per row)
        ("llama", dict(num_heads=4, num_kv_heads=2, max_position_embeddings=1024),
         {"embd": Q.Q8_0, "attn": Q.Q4_1, "ffn": Q.F16}, "quantized"),
        # Gemma's file: q|k|v of Q5_0 and Q8_0 (q8), Q5_0 gate|up (int5), Q8_0 down (q8);
        # Q8_0 v beside Q4_1 q|k: an int4 pair
        ("llama", dict(num_heads=4, num_kv_heads=2, max_position_embeddings=1024),
         {"embd": Q.Q8_0, "attn": Q.Q5_0, "attn_v": Q.Q8_0, "attn_output": Q.Q4_1, "ffn": Q.Q5_0,
          "ffn_down": Q.Q8_0}, "quantized"),
        ("qwen3", dict(num_heads=4, num_kv_heads=2, max_position_embeddings=1024),
         {"embd": Q.Q8_0, "attn": Q.Q4_1, "attn_v": Q.Q8_0, "ffn": Q.Q5_1, "ffn_down": Q.Q4_0}, "mixed"),
    ],
)
@KV_DTYPES
def test_native_decode_matches_eager(tmp_path: Path, family: str, kwargs: dict, qtypes: dict, form: str,
                                     kv_dtype: torch.dtype) -> None:
    model = load_model(_gguf(tmp_path, family, qtypes, **kwargs), progress=False, weight_form=form).model
    native = NativeDecoder.build(model)
    assert native is not None
    assert native.kinds == _kinds(qtypes) * len(model.layers)
    # Rows of different lengths: a short one, one that crosses the 256-key work units
    # (split over threads and merged), and a one-token prompt.
    prompts = [list(range(3, 12)), [(7 * i) % 200 + 3 for i in range(600)], [5]]
    _decode_both(model, native, prompts, steps=6, kv_dtype=kv_dtype)
    _decode_both(model, native, prompts[:1], steps=4, kv_dtype=kv_dtype)  # one user's step
    # More rows than NARROW_ROWS: mixed's kept wide GEMMs (bf16, fp16 or fp32), in both paths
    _decode_both(model, native, [[3 + i, 40 + 2 * i, 90 - i] for i in range(NARROW_ROWS + 2)], steps=3,
                 kv_dtype=kv_dtype)


def test_a_q4_k_m_file_decodes_natively_in_its_own_blocks(tmp_path: Path) -> None:
    """A Q4_K_M file as llama.cpp's recipe types it (experiments/synthetic_gguf.py, random
    blocks at a tiny shape): Q4_K with its own scales (kind 6), Q6_K ffn_down as q6 (8), and
    q|k|v with a Q6_K v as a stack of the two (9, each part's columns written in place);
    the native step equals the eager one."""
    from experiments.synthetic_gguf import Shape, use_more_bits, write

    if not PLAN.int4:
        pytest.skip("the packed int4 forms are not built here")
    shape = Shape("llama", 256, 8, 4, 2, 64, 512, 49152 + 40, True, 500000.0)
    path = write(shape, "q4_k_m", tmp_path / "q4_k_m.gguf", progress=False)
    model = load_model(str(path), progress=False, weight_form="quantized", max_num_seqs=4).model
    native = NativeDecoder.build(model)
    assert native is not None
    want = []
    for i in range(shape.layers):
        more = use_more_bits(i, shape.layers)
        want += [9 if more else 6, 6, 6, 8 if more else 6]
    assert native.kinds == want and 8 in want and 9 in want
    prompts = [list(range(3, 12)), [(7 * i) % 200 + 3 for i in range(300)], [5]]
    _decode_both(model, native, prompts, steps=4)
    _decode_both(model, native, prompts[:1], steps=3)


def test_a_mixed_form_keeps_copies_only_where_the_narrow_gemm_has_no_many_row_body(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`mixed` on a CPU whose many-row body beats a kept copy (weight_plan.many_replaces_copy:
    AVX2): a Q4_K_M file whose o_proj is Q8_0 keeps a wide copy of o_proj alone; the native
    step takes the copy there and the blocks' own GEMMs elsewhere, at one row and at more than
    the many-row body's."""
    import experiments.synthetic_gguf as synthetic
    from ignis.model.packed import MixedLinear
    from ignis.model.weight_plan import many_replaces_copy

    if not PLAN.int4 or not many_replaces_copy():
        pytest.skip("no many-row body that beats a kept copy on this CPU")
    real = synthetic.tensors
    monkeypatch.setattr(synthetic, "tensors", lambda shape, qtype: [
        (n, dims, "Q8_0" if n.endswith("attn_output.weight") else t) for n, dims, t in real(shape, qtype)])
    shape = synthetic.Shape("llama", 256, 2, 4, 2, 64, 512, 49152 + 40, True, 500000.0)
    path = synthetic.write(shape, "q4_k_m", tmp_path / "q4_k_m.gguf", progress=False)
    model = load_model(str(path), progress=False, weight_form="mixed", max_num_seqs=64).model
    ops = [(lin.linear_op, isinstance(lin.linear_op, MixedLinear)) for layer in model.layers for lin in _linears(layer)]
    assert [mixed for _, mixed in ops] == [False, True, False, False] * shape.layers
    native = NativeDecoder.build(model)
    assert native is not None and len(native.wide) == 4 * shape.layers
    assert [w.numel() > 0 for w in native.wide] == [False, True, False, False] * shape.layers
    _decode_both(model, native, [list(range(3, 12)), [5]], steps=2)
    _decode_both(model, native, [[3 + i, 40 + 2 * i] for i in range(cpu_native.many_rows() + 1)], steps=2)


def _kind(qtype: Q) -> int:
    """decode.cpp's NarrowKind for a projection stored as `qtype`: int8 (0), int4 (1), int5
    (3), q8 (4), int4 / int5 with the K types' own scales (6, 7), q6 (8); an int4 pair (2) is
    a fused projection mixing Q8_0 with other blocks."""
    if not PLAN.int4:
        return 0
    return {Q.Q4_0: 1, Q.Q4_1: 1, Q.Q4_K: 6, Q.Q5_0: 3, Q.Q5_1: 3, Q.Q5_K: 7, Q.Q8_0: 4, Q.Q6_K: 8}.get(qtype, 0)


def _kinds(qtypes: dict) -> list[int]:
    """The four projections' NarrowKinds (qkv, o, gate_up, down) for a file typed as
    build_tiny_gguf types it (per kind, or per tensor)."""
    parts = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",))
    kinds = []
    for names in parts:
        types = {qtypes.get(n, qtypes["attn" if n.startswith("attn") else "ffn"]) for n in names}
        if len(types) == 1 or not PLAN.int4:
            kinds.append(_kind(types.pop()))
        elif types <= {Q.Q8_0, Q.Q5_0, Q.Q4_0}:
            kinds.append(4)
        elif Q.Q8_0 in types:
            kinds.append(2)
        else:
            kinds.append(3)
    return kinds


# Layers beyond Llama's, in GGUFs llama.cpp's own converter writes (f32 weights, packed
# per row as int8; q8_0, held exactly as int8 + block scales): Gemma 3 (sandwich norms, GeGLU,
# per-head q/k norms, sqrt(hidden) embedding scale, 5 windowed layers on their own RoPE
# table to each full one, head dim 256: the attention's widest tile), Granite (embedding
# and residual multipliers, its attention scale), Phi-3 (q|k|v and gate|up stored fused).
FAMILY_CASES = {
    "gemma3": dict(num_layers=6, num_heads=2, num_kv_heads=1, head_dim=256, sliding_window=5,
                   query_pre_attn_scalar=256, rope_theta=1e6, tie_word_embeddings=True,
                   hidden_activation="gelu_pytorch_tanh"),
    "granite": dict(num_heads=4, num_kv_heads=2, embedding_multiplier=6.0, residual_multiplier=0.4,
                    attention_multiplier=0.05, logits_scaling=3.0),
    "phi3": dict(num_heads=4, num_kv_heads=2),
}


def _converter() -> Path:
    converter = converter_dir()
    if converter is None:
        pytest.skip("llama.cpp's convert_hf_to_gguf.py is not here (make test extracts it; IGNIS_LLAMACPP_DIR)")
    return converter


def _convert_each(converter: Path, dirs: dict[str, Path], root: Path) -> dict[tuple[str, str], Path]:
    """Each directory as llama.cpp's converter writes it at f32 and at q8_0: (name, outtype) -> file."""
    out = {}
    for outtype in ("f32", "q8_0"):
        jobs = [(d, root / f"{name}-{outtype}.gguf") for name, d in dirs.items()]
        convert(converter, jobs, outtype)
        out.update({(name, outtype): dst for (_, dst), name in zip(jobs, dirs, strict=True)})
    return out


@pytest.fixture(scope="module")
def family_ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    converter = _converter()
    root = tmp_path_factory.mktemp("native-families")
    dirs = {}
    for family, kwargs in FAMILY_CASES.items():
        dirs[family] = build_tiny_model(root / family, family, intermediate_size=128, max_position_embeddings=1024,
                                        **kwargs)
        if family in ("gemma3", "phi3"):
            build_tiny_spm(dirs[family])  # the converter wants a tokenizer.model for these
    return _convert_each(converter, dirs, root)


@pytest.mark.parametrize("outtype, form", [("f32", "quantized"), ("q8_0", "quantized"), ("q8_0", "mixed")])
@pytest.mark.parametrize("family", list(FAMILY_CASES))
def test_other_families_decode_natively(family_ggufs: dict, family: str, outtype: str, form: str) -> None:
    model = load_model(str(family_ggufs[family, outtype]), progress=False, weight_form=form).model
    native = NativeDecoder.build(model)
    assert native is not None
    assert set(native.kinds) == {_kind(Q.F32 if outtype == "f32" else Q.Q8_0)}
    if family == "gemma3":
        assert native.rope_local == [1, 1, 1, 1, 1, 0] and native.windows == [5] * 5 + [0]
        assert len(native.norms) == 4 * 6 + 1
    prompts = [list(range(3, 12)), [(7 * i) % 200 + 3 for i in range(300)], [5]]
    _decode_both(model, native, prompts, steps=4)
    _decode_both(model, native, [[3 + i, 40 + 2 * i, 90 - i] for i in range(NARROW_ROWS + 2)], steps=2)


# Mixtures of experts in GGUFs llama.cpp's converter writes: gpt-oss (sinks, windowed layers
# between full ones, YaRN, a biased router whose top k logits are softmaxed, biased experts
# held as the file's MXFP4, the clamped SwiGLU), Qwen3-MoE (per-head q/k norms; softmax,
# top k, renormalised) and Mixtral.
MOE_CASES = {
    "qwen3_moe": dict(num_layers=2, num_heads=4, num_kv_heads=2, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, norm_topk_prob=True),
    "mixtral": dict(num_layers=2, num_heads=4, num_kv_heads=2, num_local_experts=4, num_experts_per_tok=2,
                    intermediate_size=64),
}


@pytest.fixture(scope="module")
def moe_ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    from tests.model.test_families import GPT_OSS
    from tests.model.tiny_models import mxfp4_gpt_oss

    converter = _converter()
    root = tmp_path_factory.mktemp("native-moe")
    dirs = {family: build_tiny_model(root / family, family, max_position_embeddings=1024, **kwargs)
            for family, kwargs in MOE_CASES.items()}
    oss = build_tiny_model(root / "gpt_oss", "gpt_oss", seed=5, **{**GPT_OSS, "max_position_embeddings": 1024})
    dirs["gpt_oss"] = mxfp4_gpt_oss(oss, root / "gpt_oss-dense", root / "gpt_oss-mxfp4")[1]
    return _convert_each(converter, dirs, root)


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
@pytest.mark.parametrize("family", ["gpt_oss", *MOE_CASES])
def test_mixtures_decode_natively(moe_ggufs: dict, family: str, outtype: str) -> None:
    model = load_model(str(moe_ggufs[family, outtype]), progress=False, weight_form="quantized").model
    native = NativeDecoder.build(model)
    assert native is not None
    E, L = model.config.num_experts, len(model.layers)
    assert len(native.kinds) == L * (2 + 2 * E) and len(native.routers) == L
    if family == "gpt_oss":  # its experts stay the file's MXFP4 at either outtype
        assert native.kinds[2:2 + 2 * E] == [5] * (2 * E) and len(native.sinks) == L
        assert all(b is not None for b in native.router_biases + native.biases)
    prompts = [list(range(3, 12)), [(7 * i) % 200 + 3 for i in range(300)], [5]]
    for kv_dtype in (torch.float32, torch.bfloat16):
        _decode_both(model, native, prompts, steps=4, kv_dtype=kv_dtype)
    _decode_both(model, native, prompts[2:], steps=3)  # one user's step: one row, top-k experts of E
    # What the file cannot say: unnormalised expert weights (HF Qwen3-MoE's norm_topk_prob
    # false; llama.cpp always renormalises) and a SwiGLU clamp random weights reach
    # (llama.cpp fixes it at 7).
    for m in (layer.mlp for layer in model.layers):
        m.renormalize, m.limit = False, 0.5
    native = NativeDecoder.build(model)
    assert native is not None
    _decode_both(model, native, prompts, steps=3)


def test_mixture_with_a_mixed_forms_wide_attention(moe_ggufs: dict) -> None:
    """The mixed form keeps wide copies of the attention's GEMMs only (the experts stay
    narrow): steps of more than NARROW_ROWS rows use them, the experts theirs."""
    model = load_model(str(moe_ggufs["gpt_oss", "q8_0"]), progress=False, weight_form="mixed").model
    native = NativeDecoder.build(model)
    assert native is not None and len(native.wide) == 2 * len(model.layers)
    _decode_both(model, native, [[3 + i, 40 + 2 * i, 90 - i] for i in range(NARROW_ROWS + 2)], steps=2)


@pytest.mark.parametrize("family, kwargs, why", [
    ("gemma2", dict(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, attn_logit_softcapping=4.0),
     "soft-capped attention scores"),
    ("olmo2", dict(num_heads=4, num_kv_heads=2), "post norms"),
])
def test_layers_it_does_not_compute_stay_eager(tmp_path: Path, family: str, kwargs: dict, why: str) -> None:
    assert unsupported(read_hf_config(build_tiny_model(tmp_path / family, family, **kwargs))) == why


@KV_DTYPES
def test_sliding_window_layers(tmp_path: Path, kv_dtype: torch.dtype) -> None:
    path = _gguf(tmp_path, "llama", {"attn": Q.Q4_0, "ffn": Q.Q4_0}, num_layers=3)
    model = load_model(path, progress=False, weight_form="quantized").model
    model.layers[1].self_attn.sliding_window = 5  # layer 1 sees its last 5 keys, the others all
    native = NativeDecoder.build(model)
    assert native is not None and native.windows == [0, 5, 0]
    _decode_both(model, native, [list(range(3, 40)), list(range(50, 53))], steps=5, kv_dtype=kv_dtype)


@torch.inference_mode()
def test_bf16_cache_holds_torchs_rounding(tmp_path: Path) -> None:
    """One native step over an fp32 cache and over its bf16 copy: layer 0's new K/V (computed
    before any attention, so the same fp32 values in both) are torch's rounding of the fp32
    ones, bit for bit, at the step's slots, and nothing else in the cache moves."""
    model = load_model(_gguf(tmp_path, "llama", {"attn": Q.Q4_1, "ffn": Q.Q4_1}, num_heads=4, num_kv_heads=2),
                       progress=False, weight_form="quantized").model
    native = NativeDecoder.build(model)
    assert native is not None
    prompts = [list(range(3, 30)), list(range(40, 45))]
    tables = block_tables_for([len(p) + 1 for p in prompts], BLOCK)
    blocks = max(b for t in tables for b in t) + 1
    fp32 = allocate_kv_caches(model.config, blocks, BLOCK)
    meta, pos = AttentionMetadata.build(query_lens=[len(p) for p in prompts], seq_lens=[len(p) for p in prompts],
                                        block_tables=tables, block_size=BLOCK)
    model(torch.tensor([t for p in prompts for t in p]), pos, fp32, meta)
    bf16 = allocate_kv_caches(model.config, blocks, BLOCK, dtype=torch.bfloat16)
    for (k, v), (k2, v2) in zip(fp32, bf16, strict=True):
        k2.copy_(k)
        v2.copy_(v)
    before = [c.clone() for kv in bf16 for c in kv]
    meta, pos = AttentionMetadata.build(query_lens=[1, 1], seq_lens=[len(p) + 1 for p in prompts],
                                        block_tables=tables, block_size=BLOCK)
    ids = torch.tensor([7, 8])
    want = native(ids, pos, fp32, meta.slot_mapping, meta.block_tables, meta.seq_lens)
    got = native(ids, pos, bf16, meta.slot_mapping, meta.block_tables, meta.seq_lens)
    slots = meta.slot_mapping
    for c32, c16 in zip(fp32[0], bf16[0], strict=True):
        assert torch.equal(c16.flatten(0, 1)[slots], c32.flatten(0, 1)[slots].to(torch.bfloat16))
    for old, (i, new) in zip(before, enumerate(c for kv in bf16 for c in kv), strict=True):
        rest = torch.ones(new.shape[0] * new.shape[1], dtype=torch.bool)
        rest[slots] = False
        assert torch.equal(new.flatten(0, 1)[rest], old.flatten(0, 1)[rest]), f"cache {i} moved off the step's slots"
    assert rel_err(got, want) < 0.05  # the same step, over K/V rounded to bf16


@pytest.mark.parametrize("form", ["quantized", "mixed"])
def test_every_projection_bias(tmp_path: Path, form: str) -> None:
    """Llama GGUFs carry no biases, Qwen2's only q/k/v: give o, gate|up and down one too
    (the packed op adds its bias), in both forms and both GEMM widths."""
    model = load_model(_gguf(tmp_path, "llama", {"attn": Q.Q4_1, "ffn": Q.Q4_0}), progress=False,
                       weight_form=form).model
    g = torch.Generator().manual_seed(3)
    for layer in model.layers:
        for lin in (layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            n = lin.linear_op.dense().shape[0]
            lin.linear_op.bias = torch.randn(n, generator=g)
    native = NativeDecoder.build(model)
    assert native is not None and sum(b is not None for b in native.biases) == 3 * len(model.layers)
    _decode_both(model, native, [list(range(3, 20)), [7, 8]], steps=3)
    _decode_both(model, native, [[3 + i, 40 + 2 * i] for i in range(NARROW_ROWS + 1)], steps=2)


def test_which_models_and_steps_it_serves(tmp_path: Path) -> None:
    path = _gguf(tmp_path, "llama", {"attn": Q.Q4_1, "ffn": Q.Q8_0})  # int4 attention, int8 MLP
    try:
        assert NativeDecoder.build(load_model(path, progress=False, weight_form="bfloat16").model) is None
    except UnsupportedWeightForm:
        assert PLAN.wide != "bf16"
    assert NativeDecoder.build(load_model(path, progress=False, weight_form="float32").model) is None
    path = _gguf(tmp_path / "b", "llama", {"attn": Q.Q4_1, "ffn": Q.Q4_1})
    quantized = NativeDecoder.build(load_model(path, progress=False, weight_form="quantized").model)
    mixed = NativeDecoder.build(load_model(path, progress=False, weight_form="mixed").model)
    assert quantized is not None and not quantized.wide
    assert mixed is not None and len(mixed.wide) == 4 * len(mixed.model.layers)  # the wide copy beside int4/int8
    assert mixed.wide_kind == {"bf16": 0, "fp16": 1, "fp32": 2}[PLAN.wide]


def test_engine_decodes_natively_and_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_model(_gguf(tmp_path, "llama", {"attn": Q.Q4_1, "ffn": Q.Q4_1}), progress=False,
                        weight_form="quantized")
    calls: list[int] = []
    real = NativeDecoder.__call__

    def counting(self, input_ids, *args):
        calls.append(len(input_ids))
        return real(self, input_ids, *args)

    monkeypatch.setattr(NativeDecoder, "__call__", counting)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = [list(range(3, 20)), list(range(30, 41))]
    on = LLMEngine(loaded, EngineConfig(max_num_seqs=2, num_kv_blocks=32))
    assert on.runner.native is not None
    out = on.generate(prompts, params)
    assert all(len(o.token_ids) == 8 for o in out)
    assert calls and set(calls) <= {1, 2}  # every decode step; prefill steps stay eager
    calls.clear()
    off = LLMEngine(loaded, EngineConfig(max_num_seqs=2, num_kv_blocks=32, cpu_native_decode=False))
    assert off.runner.native is None
    eager = off.generate(prompts, params)
    assert not calls
    # Deterministic on both sides, and within float rounding: the same greedy tokens.
    assert [o.token_ids for o in out] == [o.token_ids for o in eager]


def test_no_compiler_means_the_eager_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cpu_native, "_state", {})
    monkeypatch.setattr(cpu_native, "_compiler", lambda: None)
    assert cpu_native.load() is False
    monkeypatch.setattr(cpu_native, "_state", {})
    monkeypatch.setenv("IGNIS_NATIVE_CPU", "0")
    assert cpu_native.load() is False
    monkeypatch.setattr(cpu_native, "_state", {})
    monkeypatch.delenv("IGNIS_NATIVE_CPU")
    monkeypatch.setenv("IGNIS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_native, "_compiler", lambda: "/bin/false")  # a build that fails
    assert cpu_native.load() is False
    # and an engine over a model the native step would serve runs the eager forward
    loaded = load_model(_gguf(tmp_path, "llama", {"attn": Q.Q4_1, "ffn": Q.Q4_1}), progress=False,
                        weight_form="quantized")
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=2, num_kv_blocks=32))
    assert engine.runner.native is None and engine.runner.cpu_attention is not NativeCpuAttention
    out = engine.generate([list(range(3, 20))], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(out[0].token_ids) == 4
