"""Model runtime: configs, loaders (GGUF, Hugging Face), the paged-cache transformer forward."""

from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.config import ModelConfig
from ignis.model.kv_cache import allocate_kv_caches, kv_cache_bytes_per_block
from ignis.model.loader import LoadedModel, build_model, load_model, load_model_from_config
from ignis.model.transformer import Transformer

__all__ = [
    "AttentionMetadata",
    "LoadedModel",
    "ModelConfig",
    "Transformer",
    "allocate_kv_caches",
    "build_model",
    "kv_cache_bytes_per_block",
    "load_model",
    "load_model_from_config",
]
