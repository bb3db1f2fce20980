"""Typed configuration: the schema Hydra validates `configs/` against.

Every key lives in a dataclass, so a misspelt key is an error at start-up rather than
a silently ignored setting. The YAML files under configs/ only choose values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from hydra.core.config_store import ConfigStore


# Enums make OmegaConf reject an unknown choice when the config is composed.
class ModelFormat(str, Enum):
    auto = "auto"
    gguf = "gguf"
    hf = "hf"


class DType(str, Enum):
    auto = "auto"  # fp32 on CPU, bf16 on CUDA
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class KernelBackend(str, Enum):
    auto = "auto"  # Triton on CUDA, the PyTorch references elsewhere
    triton = "triton"
    torch = "torch"


@dataclass
class ModelConfig:
    # The name clients send as `model` and /v1/models lists; null = derived from the
    # file or directory name ("smollm2-135m" for the embedded model).
    name: str | None = None
    # A .gguf file or a Hugging Face directory; null = the embedded SmolLM2 GGUF.
    path: str | None = None
    format: ModelFormat = ModelFormat.auto
    dtype: DType = DType.auto
    device: str = "auto"  # auto | cpu | cuda | cuda:N


@dataclass
class EngineConfig:
    kernel_backend: KernelBackend = KernelBackend.auto
    block_size: int = 16  # tokens per KV-cache block
    # Scheduling: at most this many sequences run in one step, and at most this many
    # tokens (prefill chunks + one per decode) go through one forward.
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    # KV-cache size: an explicit block count wins; else kv_cache_gib of memory; else
    # auto (CUDA: 90% of the memory left after the weights; CPU: min(2 GiB, 20% of RAM)).
    num_kv_blocks: int | None = None
    kv_cache_gib: float | None = None
    enable_prefix_caching: bool = True
    # Context length (prompt + output); null = the model's max_position_embeddings, and
    # never more than the KV cache holds.
    max_model_len: int | None = None
    # CPU only: torch intra-op threads for the engine (null = torch's default).
    cpu_threads: int | None = None


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000


@dataclass
class IgnisConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    # Until the HTTP server lands, `ignis.serve` answers this one prompt and exits.
    prompt: str = "What is the capital of France?"
    max_new_tokens: int = 64
    log_level: str = "INFO"


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="ignis_schema", node=IgnisConfig)
    # Group files validate against these with `defaults: [/schema/GROUP@_here_: base]`.
    cs.store(group="schema/model", name="base", node=ModelConfig)
    cs.store(group="schema/engine", name="base", node=EngineConfig)
    cs.store(group="schema/server", name="base", node=ServerConfig)
