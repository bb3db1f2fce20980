"""`load_model`: one entry point for the embedded SmolLM2, any GGUF file and HF directories."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from tqdm.auto import tqdm

from ignis.model.config import ModelConfig
from ignis.model.sharding import AllReduce, build_shard
from ignis.model.transformer import Transformer

if TYPE_CHECKING:
    from ignis.model.chat_template import ChatTemplate
    from ignis.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

Kind = Literal["gguf", "hf", "scripted"]
EMBEDDED_NAME = "smollm2-135m"
_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


@dataclass
class LoadedModel:
    # None: loaded without weights (`load_model(weights=False)`), as a tensor-parallel
    # server's rank 0 is: its engine loads only rank 0's shard (ignis/engine/tensor_parallel.py).
    model: Transformer | None
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    eos_token_ids: tuple[int, ...]
    name: str
    path: str
    kind: Kind
    # Whether output may open with a <think> block; None = decided by the chat template.
    reasoning: bool | None = None
    # Sampling defaults the checkpoint ships (generation_config.json, GGUF general.sampling.*).
    generation_defaults: dict[str, float | int] = field(default_factory=dict)
    # Where the weights live (or, without weights, where a shard of them will): the model's
    # own when there is one.
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if self.model is not None:
            self.device, self.dtype = self.model.device, self.model.dtype

    def without_weights(self) -> LoadedModel:
        """This model's config, tokenizer and template, no longer referencing its weights."""
        return replace(self, model=None)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """"auto": bf16 on CUDA, fp32 elsewhere (CPU bf16 matmuls are slow and lossy)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected 'auto' or one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def infer_kind(path: Path) -> Kind:
    if path.is_file() and path.suffix == ".gguf":
        return "gguf"
    if path.is_dir() and (path / "config.json").is_file():
        return "hf"
    raise ValueError(f"{path} is neither a .gguf file nor a directory with config.json")


def build_model(
    config: ModelConfig,
    weights: Iterable[tuple[str, torch.Tensor]],
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Transformer:
    """Allocate the model on `device` and copy weights (unfused HF names) into it."""
    model = Transformer(config, dtype=dtype, device=device)
    model.load_weights(weights)
    return model.eval()


def load_shard(path: str, kind: str, rank: int, world: int, all_reduce: AllReduce, *, dtype: torch.dtype,
               device: str | torch.device) -> Transformer:
    """Rank `rank`'s tensor-parallel shard of a GGUF file or HF directory, dense
    (dequantized). The checkpoint is read on the CPU one tensor at a time (safetensors and
    GGUF are memory-mapped) and only this rank's slice of each goes to `device`, so a
    device never holds more than its shard."""
    p = Path(path).expanduser()
    if kind == "gguf":
        import gguf

        from ignis.model.gguf_loader import config_from_gguf, iter_gguf_weights

        reader = gguf.GGUFReader(p)
        config = config_from_gguf(reader)
        return build_shard(config, iter_gguf_weights(reader, config), rank, world, all_reduce,
                           dtype=dtype, device=device)
    if kind == "hf":
        from ignis.model.hf_loader import iter_hf_weights, read_hf_config

        return build_shard(read_hf_config(p), iter_hf_weights(p), rank, world, all_reduce, dtype=dtype, device=device)
    raise ValueError(f"cannot load weights of a {kind!r} model")


def _progress(items: Iterator[tuple[str, torch.Tensor]], total: int, enabled: bool, desc: str) -> Iterator[tuple[str, torch.Tensor]]:
    bar = tqdm(items, total=total, desc=desc, unit="tensor", disable=not enabled, leave=False)
    yield from bar


def load_model(
    path: str | None = None,
    *,
    kind: Kind | None = None,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "auto",
    progress: bool = True,
    name: str | None = None,
    script: str | None = None,
    weight_form: str = "float32",
    max_num_seqs: int | None = None,
    weights: bool = True,
) -> LoadedModel:
    """Load weights, tokenizer and chat template. path None means the embedded SmolLM2 GGUF;
    kind is inferred from the path (a .gguf file, or a directory holding config.json).
    kind "scripted" (tests and experiments) is the scripted model over `script`.
    name (what clients call the model) defaults to the file stem or directory name,
    "smollm2-135m" for the embedded model.
    weight_form: "float32" (dequantize, as the reference), "bfloat16", "quantized" or "mixed" (GGUF
    on the CPU: compact packed GEMMs, see ignis/model/packed.py) or "auto" (chosen from the
    file, the device and max_num_seqs, the engine batch it will serve).
    weights False: config, tokenizer and template only (model None), for a tensor-parallel
    engine, which loads each rank's shard itself."""
    if kind == "scripted":
        return _load_scripted(script, resolve_device(device), name)
    if path is None:
        from ignis.model.embedded import smollm2_gguf_path

        path = str(smollm2_gguf_path())
        name = name or EMBEDDED_NAME
    p = Path(path).expanduser()
    kind = kind or infer_kind(p)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    start = time.perf_counter()
    log.info("loading %s model from %s (%s on %s%s)", kind, p, dt, dev, "" if weights else ", without weights")
    if kind == "gguf":
        # An explicit dtype asks for dense weights of that dtype: "auto" then dequantizes.
        form = "float32" if weight_form == "auto" and dtype != "auto" else weight_form
        parts = _load_gguf(p, dt, dev, form, max_num_seqs, progress, weights)
    elif kind == "hf":
        parts = _load_hf(p, dt, dev, weight_form, max_num_seqs, progress, weights)
    else:
        raise ValueError(f"kind must be 'gguf' or 'hf', got {kind!r}")
    name = name or (p.stem if kind == "gguf" else p.name)
    _release_freed_heap()
    model, config = parts.model, parts.config
    if model is None:
        log.info("loaded %s without weights: %s, %d layers, in %.1f s", name, config.family, config.num_layers,
                 time.perf_counter() - start)
    else:
        params = sum(t.numel() for t in model.parameters())
        log.info(
            "loaded %s: %s, %d layers, %.1fM parameters (%s weights), in %.1f s",
            name, config.family, config.num_layers, params / 1e6, model.weight_form, time.perf_counter() - start,
        )
    return LoadedModel(
        model=model,
        config=config,
        tokenizer=parts.tokenizer,
        chat_template=parts.template,
        eos_token_ids=_eos_ids(config, parts.tokenizer),
        name=name,
        path=str(p),
        kind=kind,
        generation_defaults=parts.defaults,
        device=dev,
        dtype=dt,
    )


@dataclass
class _Checkpoint:
    """What a loader reads from one checkpoint."""

    model: Transformer | None  # None: loaded without weights
    config: ModelConfig
    tokenizer: Tokenizer
    template: ChatTemplate
    defaults: dict[str, float | int]


def _load_gguf(
    path: Path, dtype: torch.dtype, device: torch.device, weight_form: str, max_num_seqs: int | None, progress: bool,
    weights: bool = True,
) -> _Checkpoint:
    import gguf

    from ignis.model.chat_template import ChatTemplate
    from ignis.model.generation_config import from_gguf
    from ignis.model.gguf_loader import config_from_gguf, gguf_family, iter_gguf_weights
    from ignis.model.packed import load_packed_gguf
    from ignis.model.tokenizer import Tokenizer
    from ignis.model.weight_plan import mixed_copy_bytes, plan_weights

    reader = gguf.GGUFReader(path)
    fam = gguf_family(reader)
    config = config_from_gguf(reader)
    matrices = [(t.tensor_type.name, int(t.n_elements)) for t in reader.tensors if len(t.shape) == 2]
    plan = plan_weights(weight_form, kind="gguf", device=device, max_num_seqs=max_num_seqs, file_bytes=path.stat().st_size,
                        copy_bytes=mixed_copy_bytes(matrices) if device.type == "cpu" else 0)
    form = plan.form
    log.info("weight form %s: %s", form, plan.why)
    _log_tensor_types(reader)

    def bar(items: Iterator[tuple[str, Any]], desc: str) -> Iterator[tuple[str, Any]]:
        return _progress(items, len(reader.tensors), progress, desc)

    model: Transformer | None = None
    if weights and form == "float32":
        model = build_model(config, bar(iter_gguf_weights(reader, config), "dequantizing"), dtype=dtype, device=device)
    elif weights:
        model = load_packed_gguf(
            reader, config, plan, lambda items: bar(items, f"packing ({form})"), max_num_seqs=max_num_seqs
        )
    # Everything is copied out of the file's memmap, which goes with the reader.
    template = ChatTemplate.from_gguf(reader, fallback=fam.chat_template)
    _log_template(template, path)
    return _Checkpoint(model, config, Tokenizer.from_gguf(reader), template, from_gguf(reader))


def _load_hf(
    path: Path, dtype: torch.dtype, device: torch.device, weight_form: str, max_num_seqs: int | None, progress: bool,
    weights: bool = True,
) -> _Checkpoint:
    from ignis.model.chat_template import ChatTemplate
    from ignis.model.generation_config import from_hf_dir
    from ignis.model.hf_loader import hf_tensor_names, iter_hf_weights, read_hf_config
    from ignis.model.tokenizer import Tokenizer
    from ignis.model.weight_plan import plan_weights

    plan_weights(weight_form, kind="hf", device=device, max_num_seqs=max_num_seqs)  # refuses packed forms
    config = read_hf_config(path)
    model = None
    if weights:
        tensors = _progress(iter_hf_weights(path, config), len(hf_tensor_names(path)), progress, "loading weights")
        model = build_model(config, tensors, dtype=dtype, device=device)
        if config.experts_mxfp4 and model.device.type == "cpu":
            from ignis.model.packed import pack_mxfp4_experts

            log.info("MXFP4 experts kept packed in %d layers", pack_mxfp4_experts(model))
    from ignis.model.families import family

    template = ChatTemplate.from_hf_dir(path, fallback=family(config.family).chat_template)
    _log_template(template, path)
    return _Checkpoint(model, config, Tokenizer.from_hf_dir(path), template, from_hf_dir(path))


def _log_template(template: ChatTemplate, path: Path) -> None:
    if template.is_fallback:
        log.info("%s ships no chat template: using the %s template (%s)", path.name, template.fallback_name,
                 "its family's standard" if template.fallback_name != "chatml" else "no family standard")


def _log_tensor_types(reader: Any) -> None:
    """Every tensor type in the file, counted, and what the CPU forms make of each (one line)."""
    from collections import Counter

    from ignis.model.gguf_quant import describe_types

    kinds = Counter(t.tensor_type for t in reader.tensors)
    log.info("GGUF tensors: %s", describe_types(kinds))


def _eos_ids(config: ModelConfig, tokenizer: Tokenizer) -> tuple[int, ...]:
    """The checkpoint's stop ids first, then any the tokenizer adds (e.g. <|im_end|>, <|endoftext|>)."""
    eos = list(config.eos_token_ids)
    for token_id in sorted(getattr(tokenizer, "eos_token_ids", None) or ()):
        if token_id not in eos:
            eos.append(int(token_id))
    return tuple(eos)


def _release_freed_heap() -> None:
    """Hand the decode temporaries' freed heap back to the OS (glibc keeps it otherwise:
    ~50 MB of resident memory after packing SmolLM2, measured)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _load_scripted(script: str | None, device: torch.device, name: str | None) -> LoadedModel:
    from ignis.model.scripted import load_scripted

    model, tokenizer, template, eos = load_scripted(script, device)
    log.info("loaded the scripted model over %s (tests and experiments only)", script)
    return LoadedModel(
        model=model,  # type: ignore[arg-type]  # the Transformer interface, without weights
        config=model.config,
        tokenizer=tokenizer,
        chat_template=template,
        eos_token_ids=(eos,),
        name=name or "scripted",
        path=str(script),
        kind="scripted",
        reasoning=True,
    )


def load_model_from_config(cfg: Any, max_num_seqs: int | None = None, *, weights: bool = True) -> LoadedModel:
    """`load_model` with the keys of the `model` config group (ignis.config.ModelSettings);
    max_num_seqs (the engine's) lets weight_form "auto" pick for the batch it will serve;
    weights as load_model's."""
    fmt = getattr(cfg.format, "value", cfg.format)
    return load_model(
        cfg.path,
        kind=None if fmt == "auto" else fmt,
        dtype=getattr(cfg.dtype, "value", cfg.dtype),
        device=cfg.device,
        name=cfg.name,
        script=cfg.script,
        weight_form=getattr(cfg.weight_form, "value", cfg.weight_form),
        max_num_seqs=max_num_seqs,
        weights=weights,
    )
