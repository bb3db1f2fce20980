"""Every family, from its HF directory and from llama.cpp's GGUF of it, against transformers.

Each case is a tiny random checkpoint written by transformers itself, loaded by ignis's HF
loader and, converted by llama.cpp's own convert_hf_to_gguf.py (f32), by its GGUF loader.
Logits are compared with transformers' (fp32, eager attention) at every position as
max|ignis - hf| / max|hf| <= 1e-4, for two sequences batched through chunked prefill
over a cached prefix and then decode steps (block_size 4: every sequence spans blocks).
Each case turns on what its family adds, with values far enough from the defaults that
a switch left off shows (windows shorter than the prompts, caps the scores reach,
multipliers != 1, q/k norms, tied and untied heads, dense layers among routed ones).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gguf
import pytest
import torch

from ignis_kernels import cpu_native

from ignis.model.gguf_loader import config_from_gguf, iter_gguf_weights
from ignis.model.hf_loader import iter_hf_weights, read_hf_config
from ignis.model.loader import build_model
from ignis.model.transformer import Transformer
from tests.model.llamacpp_convert import convert, converter_dir
from tests.model.paged_utils import flat_forward_logits, hf_logits, rel_err
from tests.model.tiny_models import build_tiny_model, build_tiny_spm

TOL = 1e-4

GPT_OSS = dict(
    num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=32, num_local_experts=4,
    num_experts_per_tok=2, sliding_window=5, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                  "original_max_position_embeddings": 64},
)
# name -> (build_tiny_model kwargs, whether llama.cpp's converter writes it)
CASES: dict[str, tuple[dict[str, Any], bool]] = {
    "llama": (dict(family="llama", num_heads=4, num_kv_heads=2), True),
    "mistral-window": (dict(family="mistral", num_heads=4, num_kv_heads=1, sliding_window=6), False),
    "qwen2": (dict(family="qwen2", num_heads=4, num_kv_heads=2, tie_word_embeddings=True), True),
    "qwen3": (dict(family="qwen3", num_heads=4, num_kv_heads=2, head_dim=32), True),
    # 6 layers: the 5:1 window pattern llama.cpp assumes (its GGUF keeps no
    # query_pre_attn_scalar: llama.cpp takes head_dim, as every Gemma but the 27B has)
    "gemma3": (dict(family="gemma3", num_layers=6, num_heads=4, num_kv_heads=1, head_dim=16, sliding_window=5,
                    query_pre_attn_scalar=16, tie_word_embeddings=True, rope_theta=1e6,
                    hidden_activation="gelu_pytorch_tanh"), True),
    "gemma3-scalar": (dict(family="gemma3", num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                           sliding_window=5, query_pre_attn_scalar=40, hidden_activation="gelu_pytorch_tanh",
                           layer_types=["sliding_attention", "full_attention"]), False),
    # caps low enough that random weights reach them
    "gemma2": (dict(family="gemma2", num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16, sliding_window=5,
                    query_pre_attn_scalar=16, attn_logit_softcapping=4.0, final_logit_softcapping=3.0,
                    tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh"), True),
    "qwen3-moe": (dict(family="qwen3_moe", num_layers=2, num_heads=4, num_kv_heads=2, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True), True),
    # a dense layer between routed ones, unnormalised expert weights (HF only: llama.cpp
    # renormalises qwen3moe always and expects experts in every layer)
    "qwen3-moe-mixed": (dict(family="qwen3_moe", num_layers=3, num_heads=4, num_kv_heads=2, num_experts=5,
                             num_experts_per_tok=3, moe_intermediate_size=24, norm_topk_prob=False,
                             mlp_only_layers=[1]), False),
    "mixtral": (dict(family="mixtral", num_layers=2, num_heads=4, num_kv_heads=2, num_local_experts=4,
                     num_experts_per_tok=2, intermediate_size=48), True),
    "phi3": (dict(family="phi3", num_heads=4, num_kv_heads=2), True),
    "olmo2": (dict(family="olmo2", num_heads=4, num_kv_heads=2), True),
    "granite": (dict(family="granite", num_heads=4, num_kv_heads=2, embedding_multiplier=6.0,
                     residual_multiplier=0.4, attention_multiplier=0.05, logits_scaling=3.0), True),
    # sinks, windowed layers between full ones, YaRN untruncated, biased router and experts
    "gpt-oss": (dict(family="gpt_oss", **GPT_OSS), True),
    # the SwiGLU clamp low enough that random weights reach it (HF only: llama.cpp fixes it at 7)
    "gpt-oss-clamped": (dict(GPT_OSS, family="gpt_oss", swiglu_limit=0.5), False),
}
GGUF_CASES = [name for name, (_, gguf_too) in CASES.items() if gguf_too]
SPM_FAMILIES = ("gemma2", "gemma3", "phi3")  # llama.cpp's converter wants a tokenizer.model for these


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every case's directory and transformers model; the GGUFs, converted in one run."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("families")
    cases: dict[str, dict[str, Any]] = {}
    for i, (name, (spec, _)) in enumerate(CASES.items()):
        path = build_tiny_model(root / name, seed=100 + i, **spec)
        if spec["family"] in SPM_FAMILIES:
            build_tiny_spm(path)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
        cases[name] = {"path": path, "hf": hf, "spec": spec}
    converter = converter_dir()
    if converter is not None:
        convert(converter, [(cases[n]["path"], root / f"{n}.gguf") for n in GGUF_CASES])
        for n in GGUF_CASES:
            cases[n]["gguf"] = root / f"{n}.gguf"
    return cases


def _ignis_hf(case: dict[str, Any]) -> Transformer:
    config = read_hf_config(case["path"])
    return build_model(config, iter_hf_weights(case["path"], config))


def _ignis_gguf(case: dict[str, Any]) -> Transformer:
    if "gguf" not in case:
        pytest.skip("llama.cpp's convert_hf_to_gguf.py is not here (make test extracts it; IGNIS_LLAMACPP_DIR)")
    reader = gguf.GGUFReader(case["gguf"])
    config = config_from_gguf(reader)
    return build_model(config, iter_gguf_weights(reader, config))


def _prompts(vocab: int, seed: int) -> tuple[list[int], list[int]]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, vocab, (n,), generator=g).tolist() for n in (26, 19))  # type: ignore[return-value]


def _check_against_hf(model: Transformer, hf: torch.nn.Module, tol: float = TOL) -> None:
    """Chunked prefill (the second chunk over a cached prefix), then decode steps, two
    sequences in one flat batch: every position's logits equal transformers' full forward."""
    a, b = _prompts(model.config.vocab_size, seed=7)
    chunks = [
        [a[:9], a[9:15]] + [[t] for t in a[15:]],
        [b[:5], b[5:12]] + [[t] for t in b[12:]] + [[]] * 4,  # b idles (q_len 0) at the end
    ]
    got = flat_forward_logits(model, chunks, block_size=4)
    for seq, logits in zip((a, b), got):
        ref = hf_logits(hf, seq)
        assert logits.shape == ref.shape
        assert rel_err(logits, ref) <= tol, rel_err(logits, ref)


@pytest.mark.parametrize("name", list(CASES))
def test_hf_directory_matches_transformers(built: dict[str, dict[str, Any]], name: str) -> None:
    case = built[name]
    model = _ignis_hf(case)
    assert model.config.family == {"mistral": "llama"}.get(case["spec"]["family"], case["spec"]["family"])
    _check_against_hf(model, case["hf"])


@pytest.mark.parametrize("name", GGUF_CASES)
def test_llamacpp_gguf_matches_transformers(built: dict[str, dict[str, Any]], name: str) -> None:
    case = built[name]
    model = _ignis_gguf(case)
    hf_config = read_hf_config(case["path"])
    c = model.config
    assert (c.family, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (
        hf_config.family, hf_config.num_layers, hf_config.num_heads, hf_config.num_kv_heads, hf_config.head_dim)
    assert (c.layer_types, c.sliding_window, c.num_experts) == (
        hf_config.layer_types, hf_config.sliding_window, hf_config.num_experts)
    _check_against_hf(model, case["hf"])


def _forward(model: Transformer, prompt: list[int]) -> torch.Tensor:
    return flat_forward_logits(model, [[prompt]], block_size=4)[0]


def _differs_without(model: Transformer, prompt: list[int], switch: Callable[[], Callable[[], None]]) -> bool:
    """Whether turning one feature off (switch() does it and returns the undo) changes logits."""
    with_it = _forward(model, prompt)
    undo = switch()
    try:
        return rel_err(_forward(model, prompt), with_it) > 1e-3
    finally:
        undo()


@pytest.mark.parametrize("name, feature", [
    ("gemma2", "attention softcap"), ("gemma2", "final softcap"), ("gemma2", "window"),
    ("gemma3", "local rope"), ("granite", "residual scale"), ("qwen3-moe-mixed", "renormalize"),
    ("gpt-oss", "sinks"), ("gpt-oss", "window"), ("gpt-oss", "expert biases"),
    ("gpt-oss-clamped", "swiglu clamp"),
])
def test_features_are_exercised(built: dict[str, dict[str, Any]], name: str, feature: str) -> None:
    """The cases above reach what they claim: switching the feature off changes the logits."""
    model = _ignis_hf(built[name])
    prompt = _prompts(model.config.vocab_size, seed=3)[0]
    attn = [layer.self_attn for layer in model.layers]

    def set_attr(objs: list[Any], attr: str, value: Any) -> Callable[[], None]:
        saved = [getattr(o, attr) for o in objs]
        for o in objs:
            setattr(o, attr, value)
        return lambda: [setattr(o, attr, v) for o, v in zip(objs, saved)]

    switches: dict[str, Callable[[], Callable[[], None]]] = {
        "attention softcap": lambda: set_attr(attn, "softcap", None),
        "window": lambda: set_attr(attn, "sliding_window", None),
        "final softcap": lambda: set_attr([model], "config", _replace(model.config, final_logit_softcap=None)),
        "local rope": lambda: set_attr(list(model.layers), "rope", "global"),
        "residual scale": lambda: set_attr(list(model.layers), "residual_scale", 1.0),
        "renormalize": lambda: set_attr([m for m in model.modules() if hasattr(m, "renormalize")], "renormalize", True),
        "sinks": lambda: set_attr(attn, "sinks", None),
        "expert biases": lambda: set_attr([m.mlp.experts for m in model.layers], "down_proj_bias", None),
        "swiglu clamp": lambda: set_attr([m.mlp for m in model.layers], "limit", 1e9),
    }
    assert _differs_without(model, prompt, switches[feature])


def _replace(config: Any, **kw: Any) -> Any:
    from dataclasses import replace

    return replace(config, **kw)


def test_gpt_oss_mxfp4_checkpoints_match_transformers(built: dict[str, dict[str, Any]], tmp_path: Any) -> None:
    """gpt-oss's experts as the released checkpoints ship them (MXFP4 *_blocks / *_scales),
    and llama.cpp's GGUF of that directory (MXFP4 blocks repacked): transformers runs the
    same values dense. The HF pairs dequantize bit for bit; the GGUF's MXFP4 experts stay
    MXFP4 in the packed CPU form (its nibbles and exponents, exact) and equal the dense
    reference within the GEMM's rounding."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from dataclasses import replace

    from ignis.model.packed import load_packed_gguf, pack_mxfp4_experts
    from ignis.model.weight_plan import plan_weights
    from tests.model.paged_utils import quant_gemm_rtol
    from tests.model.tiny_models import mxfp4_gpt_oss

    dense_dir, mx_dir = mxfp4_gpt_oss(built["gpt-oss"]["path"], tmp_path / "dense", tmp_path / "mxfp4")
    hf = AutoModelForCausalLM.from_pretrained(dense_dir, dtype=torch.float32, attn_implementation="eager").eval()
    assert any("_blocks" in k for k in load_file(str(mx_dir / "model.safetensors")))
    config = read_hf_config(mx_dir)
    assert config.experts_mxfp4
    # Dequantized on request, the pairs are the dense checkpoint's values bit for bit.
    dense_config = replace(config, experts_mxfp4=False)
    loaded, want = dict(iter_hf_weights(mx_dir, dense_config)), dict(iter_hf_weights(dense_dir, dense_config))
    assert loaded.keys() == want.keys() and all(torch.equal(loaded[k], want[k]) for k in want)
    # Kept packed: the blocks themselves (dequantized per expert), then as mxfp4 GEMMs.
    held = build_model(config, iter_hf_weights(mx_dir, config))
    assert held.layers[0].mlp.experts.gate_up_proj is None
    _check_against_hf(held, hf)
    if cpu_native.load():
        assert pack_mxfp4_experts(held) == config.num_layers
        assert {op.form for pair in held.layers[0].mlp.experts.expert_ops for op in pair} == {"mxfp4"}
        _check_against_hf(held, hf, tol=quant_gemm_rtol(4) * 10)

    converter = converter_dir()
    if converter is None:
        pytest.skip("llama.cpp's convert_hf_to_gguf.py is not here (make test extracts it; IGNIS_LLAMACPP_DIR)")
    convert(converter, [(mx_dir, tmp_path / "mxfp4.gguf")])
    reader = gguf.GGUFReader(tmp_path / "mxfp4.gguf")
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.0.ffn_down_exps.weight"] == gguf.GGMLQuantizationType.MXFP4
    config = config_from_gguf(reader)
    _check_against_hf(build_model(config, iter_gguf_weights(reader, config)), hf)
    plan = plan_weights("quantized", kind="gguf", device=torch.device("cpu"), max_num_seqs=8)
    packed = load_packed_gguf(reader, config, plan)
    forms = {op.form for m in packed.modules() if getattr(m, "expert_ops", None) for pair in m.expert_ops for op in pair}
    if plan.int4 and cpu_native.load():
        assert forms == {"mxfp4"}
    a, _ = _prompts(config.vocab_size, seed=9)
    chunks = [[a[:10]] + [[t] for t in a[10:16]]]
    dense_logits = flat_forward_logits(build_model(config, iter_gguf_weights(reader, config)), chunks, block_size=4)[0]
    rows = sorted(((flat_forward_logits(packed, chunks, block_size=4)[0] - dense_logits).abs().amax(-1)
                   / dense_logits.abs().max()).tolist())
    assert rows[-4] < 5e-2, rows  # Q8_0 / int8 attention beside the exact experts; router flips as above


def test_unknown_architectures_list_the_supported_ones() -> None:
    from ignis.model.families import for_gguf_arch, for_hf_model_type

    with pytest.raises(NotImplementedError, match="supported: .*gemma3_text.*qwen3_moe"):
        for_hf_model_type("deepseek_v3")
    with pytest.raises(NotImplementedError, match="supported: .*gemma3.*qwen3moe"):
        for_gguf_arch("deepseek2")
    assert for_gguf_arch("llama", ["blk.0.ffn_gate_exps.weight"]).name == "mixtral"


@pytest.mark.parametrize("name", ["gemma2", "qwen3-moe", "gpt-oss", "gpt-oss-mxfp4"])
def test_triton_kernels_match_reference(built: dict[str, dict[str, Any]], name: str, tmp_path: Any) -> None:
    """The forward through the Triton kernels (interpreted): soft-capped paged attention and
    attention with sinks, the grouped expert GEMM (with biases) and the grouped MXFP4 GEMM
    over experts held as the checkpoint's blocks give the reference path's logits."""
    import ignis_kernels

    if name == "gpt-oss-mxfp4":
        from tests.model.tiny_models import mxfp4_gpt_oss

        _, mx_dir = mxfp4_gpt_oss(built["gpt-oss"]["path"], tmp_path / "dense", tmp_path / "mxfp4")
        config = read_hf_config(mx_dir)
        model = build_model(config, iter_hf_weights(mx_dir, config))
        assert model.layers[0].mlp.experts.mxfp4
    else:
        model = _ignis_hf(built[name])
    a, b = (p[:11] for p in _prompts(model.config.vocab_size, seed=5))
    chunks = [[a[:6], a[6:]], [b[:3], b[3:8], b[8:]]]
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


@pytest.mark.parametrize("name", GGUF_CASES)
def test_packed_cpu_forms_match_float32(built: dict[str, dict[str, Any]], name: str) -> None:
    """The packed CPU forms build every family's GGUF from its blocks (the family's tensor
    map, fused and stacked expert weights included) and stay within bf16/int8 rounding of
    the dense float32 model. Gemma's sandwich norms and sqrt(hidden) embedding scale
    amplify rounding in these tiny random models (bf16 weights alone: ~4e-2, measured): 0.15
    there. A mixture's rounding can flip a router's choice near a tie, which moves that
    token's logits by far more (one of 16 positions in qwen3-moe, 0.19, measured), and the
    positions after it see the flipped token through the cache (gpt-oss, mixed form: a
    0.008 gap between its 2nd and 3rd experts flipped at one decode step, and 3 positions
    moved 0.09-0.24, measured): there all but three positions must hold 5e-2."""
    from ignis.model.packed import load_packed_gguf
    from ignis.model.weight_plan import plan_weights

    case = built[name]
    if "gguf" not in case:
        pytest.skip("llama.cpp's convert_hf_to_gguf.py is not here (make test extracts it; IGNIS_LLAMACPP_DIR)")
    dense = _ignis_gguf(case)
    a, _ = _prompts(dense.config.vocab_size, seed=9)
    chunks = [[a[:10]] + [[t] for t in a[10:16]]]
    want = flat_forward_logits(dense, chunks, block_size=4)[0]
    for form in ("quantized", "mixed"):
        reader = gguf.GGUFReader(case["gguf"])
        plan = plan_weights(form, kind="gguf", device=torch.device("cpu"), max_num_seqs=8)
        packed = load_packed_gguf(reader, config_from_gguf(reader), plan)
        got = flat_forward_logits(packed, chunks, block_size=4)[0]
        rows = sorted(((got - want).abs().amax(-1) / want.abs().max()).tolist())
        if dense.config.is_moe:
            rows = rows[:-3]
        tol = 0.15 if dense.config.norm_layout == "sandwich" else 5e-2
        assert rows[-1] < tol, (form, rows[-1])
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75


def test_tensor_parallel_cuts_fused_checkpoint_projections(built: dict[str, dict[str, Any]]) -> None:
    """Phi-3 stores q|k|v and gate|up fused: each rank's shard holds exactly the rows the
    unfused plan gives it (its q heads, its kv heads, its intermediate rows), and families
    without a plan are refused with the reason."""
    from ignis.model.sharding import build_shard, plan_shard

    case = built["phi3"]
    config = read_hf_config(case["path"])
    full = _ignis_hf(case)
    c, d = config, config.head_dim
    for rank in range(2):
        shard = build_shard(config, iter_hf_weights(case["path"], config), rank, 2, lambda t: t,
                            dtype=torch.float32, device="cpu")
        plan = shard.tp_plan
        q, k, v = full.layers[0].self_attn.qkv_proj.weight.split((c.q_size, c.kv_size, c.kv_size))
        want = torch.cat([t[h.start * d : h.stop * d] for t, h in ((q, plan.q_heads), (k, plan.kv_heads),
                                                                  (v, plan.kv_heads))])
        assert torch.equal(shard.layers[0].self_attn.qkv_proj.weight, want)
        gate, up = full.layers[0].mlp.gate_up_proj.weight.chunk(2)
        i = plan.intermediate
        assert torch.equal(shard.layers[0].mlp.gate_up_proj.weight, torch.cat((gate[i.start : i.stop], up[i.start : i.stop])))
    with pytest.raises(ValueError, match="OLMo 2 normalises q and k"):
        plan_shard(read_hf_config(built["olmo2"]["path"]), 0, 2)
