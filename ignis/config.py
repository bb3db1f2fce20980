"""Typed configuration: the schema Hydra validates `configs/` against.

Every key lives in a dataclass, so a misspelt key is an error at start-up rather than
a silently ignored setting. The YAML files under configs/ only choose values.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

# Hydra and OmegaConf are imported where they are used (register, config_object): the
# engine reads only the dataclasses, and must import where neither is installed (the
# GPU machine's image; experiments/gpu/engine_check.py).


# Enums make OmegaConf reject an unknown choice when the config is composed.
class ModelFormat(str, Enum):
    auto = "auto"
    gguf = "gguf"
    hf = "hf"
    scripted = "scripted"  # tests and experiments only: see ignis/model/scripted.py


class DType(str, Enum):
    auto = "auto"  # fp32 on CPU, bf16 on CUDA
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class WeightForm(str, Enum):
    auto = "auto"  # CPU + GGUF: quantized for max_num_seqs <= 4, else mixed where it fits; elsewhere float32
    float32 = "float32"  # dequantize every weight (model.dtype decides on CUDA)
    bfloat16 = "bfloat16"  # CPU: oneDNN-packed bf16 GEMMs, bf16 activations
    quantized = "quantized"  # CPU: the GGUF's 4-bit blocks as int4 GEMMs, other types int8
    mixed = "mixed"  # CPU: both, quantized for steps of <= 4 rows, bf16 for more


class KVCacheDType(str, Enum):
    auto = "auto"  # CPU: bfloat16 for the packed weight forms, else the model's; CUDA: the model's
    float32 = "float32"
    bfloat16 = "bfloat16"


class Speculative(str, Enum):
    none = "none"
    ngram = "ngram"  # prompt lookup: ignis/engine/ngram.py


class KernelBackend(str, Enum):
    auto = "auto"  # Triton on CUDA, the PyTorch references elsewhere
    triton = "triton"
    torch = "torch"


@dataclass
class SamplingDefaults:
    """What a request that omits a sampling field gets (null = the checkpoint's own
    default from generation_config.json / GGUF metadata, else OpenAI's: temperature 1,
    top_p 1, the rest off). A field the request sets always wins."""

    # Softmax temperature for requests that send none; 0 = greedy.
    temperature: float | None = None
    # Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p.
    top_p: float | None = None
    # Keep only the top_k most likely tokens (0 or -1: off).
    top_k: int | None = None
    # Drop tokens below min_p times the most likely token's probability.
    min_p: float | None = None
    # A token seen in the prompt or output: its logit divided by this if positive,
    # multiplied if negative (1 = off).
    repetition_penalty: float | None = None
    # Subtracted from the logit of every token already in the output (0 = off).
    presence_penalty: float | None = None
    # Subtracted per occurrence of a token already in the output (0 = off).
    frequency_penalty: float | None = None
    # The output limit of a request that sets none (server.max_output_tokens still caps it).
    max_output_tokens: int | None = None


@dataclass
class ModelSettings:
    """The `model.*` keys: which checkpoint to serve and how to hold it. (The architecture
    read from the checkpoint is ignis.model.config.ModelConfig.)"""

    # The name clients send as `model` and /v1/models lists; null = derived from the
    # file or directory name ("smollm2-135m" for the embedded model).
    name: str | None = None
    # A .gguf file or a Hugging Face directory; null = the embedded SmolLM2 GGUF.
    path: str | None = None
    format: ModelFormat = ModelFormat.auto
    # format=scripted only: the YAML/JSON script of replies (ignis/model/scripted.py).
    script: str | None = None
    dtype: DType = DType.auto
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)
    # How GGUF weights are held on the CPU (ignis/model/packed.py); auto keeps the file's
    # quantization for a one-user engine (engine.max_num_seqs <= 4), bf16 copies beside it
    # when it batches and they fit in memory.
    weight_form: WeightForm = WeightForm.auto
    # Set by the group files of models ignis does not ship (gguf, hf, gpt-oss): there a
    # missing model.path is an error, not the embedded model served under the group's name.
    requires_path: bool = False

    def missing(self) -> str | None:
        """The key this format needs and lacks. (A group file's ``???`` does not survive the
        merge onto the schema's null, so it is checked here.)"""
        if (self.requires_path or self.format == ModelFormat.hf) and not self.path:
            return "model.path"
        if self.format == ModelFormat.scripted and not self.script:
            return "model.script"
        return None


@dataclass
class EngineConfig:
    kernel_backend: KernelBackend = KernelBackend.auto
    block_size: int = 16  # tokens per KV-cache block
    # Scheduling: at most this many sequences run in one step, and at most this many
    # tokens (prefill chunks + one per decode) go through one forward.
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    # A step's time budget: no more prefill tokens in one step than the measured cost per
    # token says fit in this many milliseconds (a long prompt's prefill cut into short
    # steps, so a request arriving meanwhile waits little; decode rows are never cut).
    # The chunks then follow the machine's speed, and other chunks round a prompt's cache
    # differently (on the CPU a chunk of 256 rows or more multiplies bf16 weights), so where
    # two tokens nearly tie a greedy request can end differently from run to run. null =
    # the token budget alone: chunks of max_num_batched_tokens, the same on every run.
    step_time_budget_ms: float | None = 250.0
    # KV-cache size: an explicit block count wins; else kv_cache_gib of memory; else
    # auto (CUDA: 90% of the memory left after the weights; CPU: max_num_seqs sequences
    # at max_model_len, at most 25% of free RAM, resident only as blocks fill).
    num_kv_blocks: int | None = None
    kv_cache_gib: float | None = None
    enable_prefix_caching: bool = True
    # Context length (prompt + output); null = the model's max_position_embeddings, and
    # never more than the KV cache holds.
    max_model_len: int | None = None
    # CPU only: torch intra-op threads for the engine (null = torch's default), and
    # GEMMs over a oneDNN-packed copy of the linear weights (about 2x faster on AVX-512
    # CPUs, where MKL's sgemm is not; costs the weights' memory once more).
    cpu_threads: int | None = None
    cpu_pack_weights: bool = True
    # CPU, int4/int8 weight forms (model.weight_form quantized or mixed): decode steps of
    # dense models (not Gemma 2, OLMo 2, mixtures of experts) run every layer in one native call (ignis_kernels/cpu/decode.cpp, compiled once per machine
    # with the system's g++; ignis/model/native_decode.py); the other forms' decode rows
    # use its paged attention. false, or no compiler = the eager PyTorch forward.
    cpu_native_decode: bool = True
    # The KV cache's element type (ignis/model/kv_cache.py). CPU: auto = bfloat16 for the
    # packed weight forms (quantized, mixed, bfloat16: half the cache's memory; attention
    # still computes in fp32), the model's dtype for float32 (the exact reference). CUDA
    # (Triton kernels): the model's dtype; an explicit other one is refused.
    kv_cache_dtype: KVCacheDType = KVCacheDType.auto
    # Ranks the model is split over (Megatron-style, by heads; ignis/engine/tensor_parallel.py):
    # 1 = one process, as ever; N > 1 starts N-1 worker processes (or joins a `torchrun`
    # launch), NCCL between GPUs, gloo on the CPU. Needs dense weights (model.weight_form
    # float32, which auto then picks) and head counts and MLP width that N divides.
    tensor_parallel_size: int = 1
    # Speculative decoding (ignis/engine/speculation.py): ngram drafts up to
    # num_speculative_tokens tokens by prompt lookup (the tokens after the latest earlier
    # occurrence of the last speculative_ngram_max .. _min tokens, in the prompt or the
    # output) and checks them in one forward; the output is token for token what plain
    # decoding gives. Only while at most speculative_max_seqs sequences decode (a batch
    # already fills the machine), and only for requests without penalties, a thinking budget,
    # min_tokens still to reach or an output grammar whose masks come slowly (a quick one's
    # drafts end at its first refusal); on the CPU a step's rows, drafts included, stay below
    # those from which its GEMMs compute otherwise (8-bit activations from 16 rows on AVX2).
    # none = off. On by default: one user's rewrite of a file it read decodes 1.6x faster,
    # chat no slower (experiments/RESULTS.md).
    speculative: Speculative = Speculative.ngram
    num_speculative_tokens: int = 8
    speculative_ngram_max: int = 4
    speculative_ngram_min: int = 2
    speculative_max_seqs: int = 4


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    # When set, every /v1 route, the WebSocket upgrade and /admin need it (Authorization:
    # Bearer KEY, or on the upgrade a Sec-WebSocket-Protocol entry
    # openai-insecure-api-key.KEY). null = the IGNIS_API_KEY environment variable, else
    # no authentication.
    api_key: str | None = None
    # Extra names the model answers to besides model.name (listed by /v1/models too).
    model_aliases: list[str] = field(default_factory=list)
    # Seconds; 0 = no limit. request_timeout bounds a whole non-streaming request (from
    # its arrival), stream_timeout a streaming response (from its admission to the
    # engine; time spent queued does not count). Live-patchable (PATCH /admin/config).
    request_timeout: float = 600.0
    stream_timeout: float = 1800.0
    # Close a WebSocket with nothing running or queued and no text/binary frame from
    # its client for this long (code 1000); 0 = never. Live-patchable.
    socket_idle_close: float = 300.0
    # The most tokens one response may generate, as an OpenAI model's output limit: a
    # request that sets no limit, or a larger one, gets this many at most; null = up to
    # the end of the context (`engine.max_model_len`).
    max_output_tokens: int | None = None
    # The largest HTTP body or WebSocket message accepted (bytes).
    max_request_bytes: int = 32 * 1024 * 1024
    # The key that signs reasoning `encrypted_content` (any string); null = a random key
    # per process (reasoning sent back to another process is then dropped, not refused).
    reasoning_key: str | None = None
    # Seconds a 503 (engine full, HTTP) asks the client to wait (Retry-After).
    retry_after: int = 1
    # Browser origins allowed by CORS ("*" = any); empty = no CORS headers. A WebSocket
    # upgrade that sends an Origin must come from the server's own origin or one of these.
    cors_origins: list[str] = field(default_factory=list)
    # Bound to a loopback address, the server answers only to loopback Host names
    # (localhost, 127.0.0.1, [::1]) and these ("*" = any): DNS rebinding protection.
    allowed_hosts: list[str] = field(default_factory=list)
    # Seconds a client has to send a whole request head and body, from its first byte
    # (a client trickling one header line at a time is cut there with 408).
    receive_timeout: float = 60.0
    # Open connections (HTTP and WebSocket) at most; one more is answered 503 and closed.
    max_connections: int = 512
    # Server-wide bound on WebSocket message bytes (inflated) received and not yet
    # handled; a frame that would pass it is dropped with an error event. At least
    # max_request_bytes.
    socket_buffer_bytes: int = 256 * 1024 * 1024
    # One INFO line per request / socket (no keys, no prompt text).
    access_log: bool = True
    # Seconds running responses get to finish after SIGTERM / SIGINT; the ones still
    # running then are cancelled (with their terminal events) and sockets close with 1001.
    shutdown_grace: float = 10.0


@dataclass
class IgnisConfig:
    model: ModelSettings = field(default_factory=ModelSettings)
    engine: EngineConfig = field(default_factory=EngineConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    log_level: str = "INFO"


def register() -> None:
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="ignis_schema", node=IgnisConfig)
    # Group files validate against these with `defaults: [/schema/GROUP@_here_: base]`.
    cs.store(group="schema/model", name="base", node=ModelSettings)
    cs.store(group="schema/engine", name="base", node=EngineConfig)
    cs.store(group="schema/server", name="base", node=ServerConfig)


def config_object(dcfg: DictConfig) -> Any:
    """The composed config as its dataclass, with logging set up at its `log_level`; a
    missing mandatory value (`+model=hf` without `model.path=DIR`) exits 2 with one line,
    not a traceback. Shared by the `ignis.serve` and `ignis.generate` entry points."""
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    logging.basicConfig(level=dcfg.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = OmegaConf.to_object(dcfg)
        key = cfg.model.missing() if isinstance(getattr(cfg, "model", None), ModelSettings) else None
    except MissingMandatoryValue as exc:
        key = exc.full_key
    if key is not None:
        print(f"ignis: missing config value {key} (set it with {key}=...)", file=sys.stderr)
        sys.exit(2)
    return cfg
