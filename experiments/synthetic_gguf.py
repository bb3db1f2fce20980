"""A GGUF of a real model's shape with random weights, for speed measurements at real sizes.

    .venv/bin/python experiments/synthetic_gguf.py --shape llama-3.2-1b [--type q4_k_m|q8_0|mxfp4] [--out FILE]
    .venv/bin/python experiments/synthetic_gguf.py --list

A decode step's cost depends on the shapes and types of the weights, not their values, so a
file of random blocks times like the real checkpoint without downloading it. The blocks are
random bytes with their scale fields set to small normal fp16 values, so every weight is
finite, near zero mean and of an initialisation's size (activations stay finite through the
layers; the text is noise). The tokenizer is the embedded SmolLM2's (GPT-2 byte-level BPE,
ChatML template), its vocabulary padded with control tokens to the shape's size, so the
embedding and the LM head have their real size and llama.cpp and ignis both serve the file.

`q4_k_m` follows llama.cpp's Q4_K_M recipe: Q4_K everywhere, Q6_K for the LM head (the tied
embedding when the shape ties them) and for attn_v / ffn_down on the layers its
`use_more_bits` rule picks; `q8_0` is Q8_0 for every matrix. `mxfp4` is llama.cpp's
MXFP4_MOE (llama-quant.cpp: stacked expert tensors MXFP4, every other matrix, the head and
the embedding included, Q8_0), what ggml-org's gpt-oss GGUFs hold; a dense shape gets Q8_0
throughout. Norms are F32 ones; the other vectors (biases, gpt-oss's sinks) and the MoE
router, which llama.cpp never quantizes, are small random F32, so tokens spread over the
experts as real routing does (a constant router would send every token to the same ones).

gpt-oss (`gpt-oss-20b`, `gpt-oss-120b`): every tensor llama.cpp's openai-moe loader requires
(q/k/v/o biases, attn_sinks, post_attention_norm, the router's bias, the experts' biases),
its sliding window (llama.cpp and ignis both take the period 2, layer 0 windowed, when the
file names no pattern) and YaRN keys. Its rows (2880) hold no whole Q4_K block, so it comes
in `mxfp4` (as published) or `q8_0`. Its padded vocabulary names o200k_harmony's control
tokens at their real ids (ignis renders gpt-oss prompts in harmony with those ids); the
file's own chat template stays SmolLM2's ChatML.

Files go to `.cache/synthetic/` (git-ignored) unless --out says otherwise; never into CI.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "synthetic"


@dataclass(frozen=True)
class Shape:
    arch: str  # GGUF general.architecture: llama, qwen3, qwen3moe, gpt-oss
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense MLP width, or each expert's width for MoE
    vocab: int
    tied: bool
    rope_theta: float
    context: int = 8192  # what the file declares (both servers size their caches from flags)
    experts: int = 0
    experts_used: int = 0
    qk_norm: bool = False
    sliding_window: int = 0  # the window, on the layers the architecture's default period picks
    yarn: tuple[float, int] | None = None  # YaRN's (factor, original context)


# The published configs' sizes (config.json of each checkpoint).
SHAPES: dict[str, Shape] = {
    "llama-3.2-1b": Shape("llama", 2048, 16, 32, 8, 64, 8192, 128256, True, 500000.0),
    "llama-3.2-3b": Shape("llama", 3072, 28, 24, 8, 128, 8192, 128256, True, 500000.0),
    "llama-3.1-8b": Shape("llama", 4096, 32, 32, 8, 128, 14336, 128256, False, 500000.0),
    "qwen3-8b": Shape("qwen3", 4096, 36, 32, 8, 128, 12288, 151936, False, 1000000.0, qk_norm=True),
    "qwen3-30b-a3b": Shape("qwen3moe", 2048, 48, 32, 4, 128, 768, 151936, False, 1000000.0,
                           experts=128, experts_used=8, qk_norm=True),
    # openai/gpt-oss-*: one width (2880) for the residual and each expert; 131072 context by YaRN
    "gpt-oss-20b": Shape("gpt-oss", 2880, 24, 64, 8, 64, 2880, 201088, False, 150000.0, context=131072,
                         experts=32, experts_used=4, sliding_window=128, yarn=(32.0, 4096)),
    "gpt-oss-120b": Shape("gpt-oss", 2880, 36, 64, 8, 64, 2880, 201088, False, 150000.0, context=131072,
                          experts=128, experts_used=4, sliding_window=128, yarn=(32.0, 4096)),
}
TYPES = ("q4_k_m", "q8_0", "mxfp4")
# o200k_harmony's control tokens (gpt-oss's tokenizer) and their ids.
HARMONY_TOKENS = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>",
                  200003: "<|constrain|>", 200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>",
                  200008: "<|message|>", 200012: "<|call|>"}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule (llama-quant.cpp) for which layers' attn_v / ffn_down get Q6_K in Q4_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensors(shape: Shape, qtype: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy-order shape, type name) of every tensor, in llama.cpp's order."""
    import gguf

    q4, q6, q8, f32 = "Q4_K", "Q6_K", "Q8_0", "F32"
    big = q4 if qtype == "q4_k_m" else q8
    head = q6 if qtype == "q4_k_m" else q8
    oss = shape.arch == "gpt-oss"
    h, d = shape.hidden, shape.head_dim
    out: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (shape.vocab, h), head if shape.tied else big),
                                                   ("output_norm.weight", (h,), f32)]
    if not shape.tied:
        out.append(("output.weight", (shape.vocab, h), head))
    for i in range(shape.layers):
        more = qtype == "q4_k_m" and use_more_bits(i, shape.layers)
        b = f"blk.{i}."
        q, kv = shape.heads * d, shape.kv_heads * d
        out += [(b + "attn_norm.weight", (h,), f32),
                (b + "attn_q.weight", (q, h), big),
                (b + "attn_k.weight", (kv, h), big),
                (b + "attn_v.weight", (kv, h), q6 if more else big),
                (b + "attn_output.weight", (h, q), big)]
        if oss:  # biases on every projection, and a sink logit per query head
            out += [(b + "attn_q.bias", (q,), f32), (b + "attn_k.bias", (kv,), f32),
                    (b + "attn_v.bias", (kv,), f32), (b + "attn_output.bias", (h,), f32),
                    (b + "attn_sinks.weight", (shape.heads,), f32)]
        if shape.qk_norm:
            out += [(b + "attn_q_norm.weight", (d,), f32), (b + "attn_k_norm.weight", (d,), f32)]
        out.append((b + ("post_attention_norm.weight" if oss else "ffn_norm.weight"), (h,), f32))
        if shape.experts:
            e, f = shape.experts, shape.ffn
            exps = "MXFP4" if qtype == "mxfp4" else big
            out += [(b + "ffn_gate_inp.weight", (e, h), f32),
                    (b + "ffn_gate_exps.weight", (e, f, h), exps),
                    (b + "ffn_up_exps.weight", (e, f, h), exps),
                    (b + "ffn_down_exps.weight", (e, h, f), q6 if more else exps)]
            if oss:  # the router's bias and each expert's
                out += [(b + "ffn_gate_inp.bias", (e,), f32), (b + "ffn_gate_exps.bias", (e, f), f32),
                        (b + "ffn_up_exps.bias", (e, f), f32), (b + "ffn_down_exps.bias", (e, h), f32)]
        else:
            out += [(b + "ffn_gate.weight", (shape.ffn, h), big),
                    (b + "ffn_up.weight", (shape.ffn, h), big),
                    (b + "ffn_down.weight", (h, shape.ffn), q6 if more else big)]
    for name, dims, t in out:  # every quantized row must hold whole blocks
        block, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]]
        if dims[-1] % block:
            raise ValueError(f"{name}'s rows ({dims[-1]}) hold no whole {t} block of {block}: "
                             f"this shape cannot be written as {qtype}")
    return out


def file_bytes(shape: Shape, qtype: str) -> int:
    """The tensor data's size (the file's, less its metadata)."""
    import gguf

    size = 0
    for _, dims, t in tensors(shape, qtype):
        block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]]
        size += int(np.prod(dims)) // block * nbytes
    return size


# Where each block type keeps its fp16 scale fields (byte offsets in the block), and which
# bytes are signed per-sub-block scales to keep small. Values 2^-14 (fp16's smallest
# normal) and 2^-12 give weights with a standard deviation of ~0.005-0.02.
_D_SMALL = np.float16(2.0**-14)
_D_Q8 = np.float16(2.0**-12)


def random_blocks(rng: np.random.Generator, dims: tuple[int, ...], type_name: str) -> np.ndarray:
    """Random blocks of `type_name` for a tensor of numpy shape `dims`, as uint8 (rows, bytes)."""
    import gguf

    qt = gguf.GGMLQuantizationType[type_name]
    if qt == gguf.GGMLQuantizationType.F32:
        return np.ones(dims, dtype=np.float32)  # norms: the identity scale
    block, size = gguf.GGML_QUANT_SIZES[qt]
    n_blocks = int(np.prod(dims)) // block
    raw = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).reshape(n_blocks, size).copy()
    if qt == gguf.GGMLQuantizationType.Q4_K:  # d, dmin (fp16), 12 bytes of 6-bit scales/mins, 128 of nibbles
        raw[:, 0:2] = np.full((n_blocks, 1), _D_SMALL).view(np.uint8)
        # dmin * mean(min) ~ d * mean(scale * q): weights centred near zero
        raw[:, 2:4] = np.full((n_blocks, 1), np.float16(7.5 * 2.0**-14)).view(np.uint8)
    elif qt == gguf.GGMLQuantizationType.Q6_K:  # 128 ql, 64 qh, 16 int8 scales, d (fp16)
        raw[:, 192:208] = (rng.integers(-8, 9, (n_blocks, 16), dtype=np.int8)).view(np.uint8)
        raw[:, 208:210] = np.full((n_blocks, 1), _D_SMALL).view(np.uint8)
    elif qt == gguf.GGMLQuantizationType.Q8_0:  # d (fp16), 32 int8
        raw[:, 0:2] = np.full((n_blocks, 1), _D_Q8).view(np.uint8)
    elif qt == gguf.GGMLQuantizationType.MXFP4:  # e8m0 exponent e, then 32 e2m1 nibbles
        # w = 2^(e - 128) * (2 * e2m1), |2 * e2m1| <= 12 with an rms of ~5.9 over random
        # nibbles: e in {119, 120} gives a standard deviation of ~0.01-0.02, as Q8_0's above.
        raw[:, 0] = rng.integers(119, 121, n_blocks, dtype=np.uint8)
    else:
        raise ValueError(f"no random block writer for {type_name}")
    return raw.reshape(*dims[:-1], dims[-1] // block * size)


def f32_values(rng: np.random.Generator, name: str, dims: tuple[int, ...]) -> np.ndarray:
    """An F32 tensor: a norm is ones (the identity scale); a bias, a sink or a router small
    random values (std 0.02), so the router's logits differ token to token."""
    if name.endswith("norm.weight"):
        return np.ones(dims, dtype=np.float32)
    return (rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)).astype(np.float32)


def _copy_tokenizer(writer, vocab: int, named: dict[int, str] | None = None) -> None:
    """The embedded SmolLM2's tokenizer, padded with control tokens to `vocab` entries
    (`named`: padding ids given these names instead, unless SmolLM2 has the name)."""
    import gguf

    from ignis.model.embedded import smollm2_gguf_path

    reader = gguf.GGUFReader(smollm2_gguf_path())

    def value(key: str):
        field = reader.get_field(key)
        return None if field is None else field.contents()

    tokens: list[str] = value("tokenizer.ggml.tokens")
    types: list[int] = value("tokenizer.ggml.token_type")
    if vocab < len(tokens):
        raise ValueError(f"the shape's vocabulary ({vocab}) is smaller than SmolLM2's ({len(tokens)})")
    own, pad = len(tokens), vocab - len(tokens)
    # Named as Llama 3's reserved tokens are; control tokens are never produced by encoding text.
    tokens = tokens + [f"<|reserved_special_token_{i}|>" for i in range(pad)]
    have = set(tokens)
    for i, text in (named or {}).items():
        # never over one of SmolLM2's own tokens, nor a second copy of one (<|endoftext|>)
        if own <= i < vocab and text not in have:
            tokens[i] = text
    types = types + [int(gguf.TokenType.CONTROL)] * pad
    writer.add_tokenizer_model(value("tokenizer.ggml.model"))
    pre = value("tokenizer.ggml.pre")
    if pre:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(value("tokenizer.ggml.merges"))
    for key, add in (("tokenizer.ggml.bos_token_id", writer.add_bos_token_id),
                     ("tokenizer.ggml.eos_token_id", writer.add_eos_token_id),
                     ("tokenizer.ggml.unknown_token_id", writer.add_unk_token_id),
                     ("tokenizer.ggml.padding_token_id", writer.add_pad_token_id)):
        v = value(key)
        if v is not None:
            add(int(v))
    if value("tokenizer.ggml.add_bos_token") is not None:
        writer.add_add_bos_token(bool(value("tokenizer.ggml.add_bos_token")))
    writer.add_chat_template(value("tokenizer.chat_template"))


def write(shape: Shape, qtype: str, out: Path, *, seed: int = 0, progress: bool = True) -> Path:
    """Write the file; returns its path. Tensors are generated one at a time (memory: one tensor)."""
    import gguf

    if qtype not in TYPES:
        raise ValueError(f"unknown type {qtype!r}; expected one of {TYPES}")
    out.parent.mkdir(parents=True, exist_ok=True)
    a = shape.arch
    w = gguf.GGUFWriter(out, a)
    w.add_name(f"synthetic {out.stem}")
    ftype = {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M,
             "mxfp4": gguf.LlamaFileType.MOSTLY_MXFP4_MOE}[qtype]
    plan = tensors(shape, qtype)  # refuses a type the shape's rows cannot hold, before writing
    w.add_file_type(int(ftype))
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(1e-6 if a.startswith("qwen") else 1e-5)
    w.add_vocab_size(shape.vocab)
    if shape.experts:
        w.add_expert_count(shape.experts)
        w.add_expert_used_count(shape.experts_used)
        w.add_expert_feed_forward_length(shape.ffn)
    if shape.sliding_window:  # no pattern key: the architecture's period (gpt-oss: 2)
        w.add_sliding_window(shape.sliding_window)
    if shape.yarn:  # as llama.cpp's converter writes gpt-oss's rope_scaling (betas: its config's)
        factor, original = shape.yarn
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_yarn_beta_fast(32.0)
        w.add_rope_scaling_yarn_beta_slow(1.0)
    _copy_tokenizer(w, shape.vocab, HARMONY_TOKENS if a == "gpt-oss" else None)

    for name, dims, t in plan:
        qt = gguf.GGMLQuantizationType[t]
        if qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor_info(name, dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
        else:
            block, size = gguf.GGML_QUANT_SIZES[qt]
            byte_dims = (*dims[:-1], dims[-1] // block * size)
            w.add_tensor_info(name, byte_dims, np.dtype(np.uint8), int(np.prod(byte_dims)), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    total = len(plan)
    for k, (name, dims, t) in enumerate(plan):
        w.write_tensor_data(f32_values(rng, name, dims) if t == "F32" else random_blocks(rng, dims, t))
        if progress and (k % 16 == 0 or k == total - 1):
            print(f"\r  {k + 1}/{total} tensors", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    w.close()
    return out


def weight_bytes_per_token(path: Path) -> int:
    """Bytes of weights one decode step reads: every tensor once, except the embedding table
    (one row per token), which an untied model's head does not read; a tied head reads it
    whole. MoE expert tensors count only the routed share (experts_used / experts)."""
    import gguf

    reader = gguf.GGUFReader(path)
    names = {t.name for t in reader.tensors}
    arch = reader.get_field("general.architecture").contents()
    used = reader.get_field(f"{arch}.expert_used_count")
    count = reader.get_field(f"{arch}.expert_count")
    share = used.contents() / count.contents() if used is not None and count is not None else 1.0
    total = 0.0
    for t in reader.tensors:
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        total += int(t.n_bytes) * (share if "_exps." in t.name else 1.0)
    return int(total)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES))
    ap.add_argument("--type", choices=TYPES, default="q4_k_m")
    ap.add_argument("--out", type=Path, default=None, help=f"default {CACHE.relative_to(ROOT)}/SHAPE-TYPE.gguf")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true", help="the shapes and their sizes")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.list or not args.shape:
        for name, s in SHAPES.items():
            for qtype in TYPES:
                if qtype == "mxfp4" and not s.experts:
                    continue  # a dense shape's mxfp4 is its q8_0
                try:
                    size = file_bytes(s, qtype)
                except ValueError:  # rows that hold no whole block of the type
                    continue
                print(f"{name:15s} {qtype:7s} {size / 1e9:6.2f} GB")
        return
    out = args.out or CACHE / f"{args.shape}-{args.type}.gguf"
    print(f"writing {out} ({args.shape}, {args.type})", file=sys.stderr)
    start = time.perf_counter()
    write(SHAPES[args.shape], args.type, out, seed=args.seed)
    took = time.perf_counter() - start
    print(f"{out}: {out.stat().st_size / 1e9:.2f} GB in {took:.0f} s, {weight_bytes_per_token(out) / 1e9:.2f} GB "
          f"of weights read per decoded token")


if __name__ == "__main__":
    main()
