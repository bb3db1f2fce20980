"""GPU check of the sort-free sampling kernel at full size (256 rows x 151,936 vocab).

    cases(ctx) -> list[Case]   (driven by experiments/gpu/check_kernels.py)
    dry_run(ctx)               host-side preparation at toy sizes (no kernel launched)

Each case checks the Triton kernel against the PyTorch reference (token mismatches and
kept-set mismatches per row, logprob error) and times it beside the baselines a user
would otherwise run: torch.argmax for greedy rows, softmax + torch.multinomial for plain
temperature sampling, and the usual torch.sort top-k/top-p sampler for filtered rows.
Timing rotates over several copies of the logits (together > 3x the L2), so no call
finds its input in cache (one [256, 151936] bf16 batch is 78 MB against a 50-60 MB L2);
small batches are timed by graph replay. gbs counts ONE read of the logits per call, so
frac_bw near 1/passes means the kernel runs at copy bandwidth; `passes` is the mean
number of passes over the vocabulary per row (pass A + full pivot passes + a full race),
read from the kernel's debug counters on the same inputs.
"""

from __future__ import annotations

import random

import torch

from experiments.gpu.common import Case, Context, bench, row
from ignis_kernels.sampling_tensors import SamplingTensors

ROWS, VOCAB = 256, 151_936
KINDS = ("topk_topp", "mixed", "greedy", "temperature", "min_p", "penalties")


def sort_sampler(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The usual sort-based sampler (as vLLM's apply_top_k_top_p): sort, mask the top-k
    tail, softmax, cumsum, mask the top-p tail, scatter back, softmax, multinomial."""
    x = logits.float() / temperature.clamp(min=1e-5)[:, None]
    vals, idx = x.sort(dim=-1)  # ascending
    V = x.shape[1]
    kth = vals.gather(1, (V - top_k.long()).clamp(0, V - 1)[:, None])
    vals = vals.masked_fill(vals < kth, float("-inf"))
    cum = vals.softmax(-1).cumsum(-1)
    drop = cum <= 1 - top_p[:, None]
    drop[:, -1] = False
    vals = vals.masked_fill(drop, float("-inf"))
    probs = torch.empty_like(x).scatter_(1, idx, vals).softmax(-1)
    return torch.multinomial(probs, 1)[:, 0]


def make_logits(rows: int, vocab: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    """LLM-like rows: a wide Gaussian bulk plus a peaked head at random positions."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g, device=device) * 2.5
    head = torch.randint(0, vocab, (rows, 64), generator=g, device=device)
    boost = torch.linspace(10, 3, 64, device=device).expand(rows, -1)
    return x.scatter_add_(1, head, boost).to(dtype)


def make_params(rows: int, kind: str, device: str, vocab: int = VOCAB, seed: int = 0) -> SamplingTensors:
    """kind: greedy | temperature | topk_topp | min_p | mixed | penalties."""
    rng = random.Random(seed)
    temps, ks, ps, mps = [1.0] * rows, [0] * rows, [1.0] * rows, [0.0] * rows
    kw: dict = {}
    for i in range(rows):
        k = kind if kind != "mixed" else rng.choice(["greedy", "temperature", "topk_topp", "topk_topp", "min_p", "top_p"])
        if k == "greedy":
            temps[i] = 0.0
        elif k == "topk_topp":
            temps[i], ks[i], ps[i] = rng.choice([0.6, 0.8, 1.0]), rng.choice([20, 50, 100]), rng.choice([0.8, 0.9, 0.95])
        elif k == "top_p":
            temps[i], ps[i] = rng.choice([0.7, 1.0]), rng.choice([0.9, 0.95])
        elif k == "min_p":
            mps[i] = rng.choice([0.02, 0.05, 0.1])
    if kind == "penalties":
        ks, ps = [50] * rows, [0.9] * rows
        kw = dict(
            repetition_penalty=[1.1] * rows, presence_penalty=[0.5] * rows, frequency_penalty=[0.3] * rows,
            prompt_tokens=[[rng.randrange(vocab) for _ in range(2048)] for _ in range(rows)],
            output_tokens=[[rng.randrange(vocab) for _ in range(256)] for _ in range(rows)],
        )
    return SamplingTensors.from_lists(temps, top_k=ks, top_p=ps, min_p=mps, seed=[rng.getrandbits(63) for _ in range(rows)],
                                      step=[rng.randrange(1000) for _ in range(rows)], device=device, **kw)


def _compare(x: torch.Tensor, params: SamplingTensors) -> tuple[float, float, float]:
    """(token mismatch fraction, kept-set mismatch fraction, max logprob error)."""
    from ignis_kernels.sampling_penalties import apply_penalties_dense
    from ignis_kernels.sampling_ref import keep_mask, sample_ref
    from ignis_kernels.sampling_triton import sample_triton, sample_triton_debug

    tokens, lp = sample_triton(x, params, return_logprobs=True)
    want, want_lp = sample_ref(x, params, return_logprobs=True)
    _, tau, _ = sample_triton_debug(x, params)
    xp = apply_penalties_dense(x.float(), params)
    sampled = params.temperature >= 1e-5
    keep_diff = ((keep_mask(xp, params) != (xp >= tau[:, None])).any(1) & sampled).float().mean().item()
    return (tokens != want).float().mean().item(), keep_diff, (lp - want_lp).abs().max().item()


def softmax_multinomial(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Plain temperature sampling as torch does it: softmax, then multinomial."""
    probs = (logits.float() / temperature.clamp(min=1e-5)[:, None]).softmax(-1)
    return torch.multinomial(probs, 1)[:, 0]


def _copies(rows: int, dtype: torch.dtype, device: str, l2_bytes: int) -> list[torch.Tensor]:
    """Enough different logits batches that cycling through them overflows L2 three times."""
    one = rows * VOCAB * torch.empty((), dtype=dtype).element_size()
    n = max(2, min(8, -(-3 * l2_bytes // one)))
    return [make_logits(rows, VOCAB, dtype, device, seed=i) for i in range(n)]


def _l2_bytes(device: str) -> int:
    if device == "cuda":
        return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20) or (60 << 20)
    return 60 << 20


def mean_passes(x: torch.Tensor, params: SamplingTensors) -> float:
    """Mean passes over the vocabulary per row, from the kernel's debug counters."""
    from ignis_kernels.sampling_triton import sample_triton_debug

    _, _, passes = sample_triton_debug(x, params)
    return 1.0 + passes[:, 0].float().mean().item()


def _dtype_case(dtype: torch.dtype, ctx: Context) -> list[dict]:
    from ignis_kernels.sampling_triton import sample_triton

    dev = ctx.device.type
    xs = _copies(ROWS, dtype, dev, _l2_bytes(dev))
    x = xs[0]
    shape = f"{ROWS}x{VOCAB} {str(dtype).removeprefix('torch.')}"
    nbytes = x.numel() * x.element_size()
    rows: list[dict] = []
    base = make_params(ROWS, "topk_topp", dev)
    note = f"rotating {len(xs)} inputs"
    sort_t = bench([lambda x=x: sort_sampler(x, base.temperature, base.top_k, base.top_p) for x in xs])
    argmax_t = bench([lambda x=x: x.argmax(-1) for x in xs])
    temp = make_params(ROWS, "temperature", dev)
    mult_t = bench([lambda x=x: softmax_multinomial(x, temp.temperature) for x in xs])
    rows.append(row("sort sampler (top-k/p)", shape, sort_t.ms, nbytes=nbytes, copy_gbs=ctx.copy_gbs,
                    vs=f"baseline; {sort_t.label()}; {note}"))
    rows.append(row("torch.argmax (greedy)", shape, argmax_t.ms, nbytes=nbytes, copy_gbs=ctx.copy_gbs,
                    vs=f"baseline; {argmax_t.label()}"))
    rows.append(row("softmax+multinomial (temp)", shape, mult_t.ms, nbytes=nbytes, copy_gbs=ctx.copy_gbs,
                    vs=f"baseline; {mult_t.label()}"))
    versus = {"greedy": ("argmax", argmax_t.ms), "temperature": ("softmax+multinomial", mult_t.ms)}
    for kind in KINDS:
        params = base if kind == "topk_topp" else make_params(ROWS, kind, dev)
        mism, keep_diff, lp_err = _compare(x, params)
        passes = mean_passes(x, params)
        t = bench([lambda x=x: sample_triton(x, params) for x in xs])
        ok = mism <= 0.01 and keep_diff <= 0.01 and lp_err <= 1e-3
        name, ms = versus.get(kind, ("torch.sort", sort_t.ms))
        vs = (f"{name} {ms:.3f} ms -> x{ms / t.ms:.1f}; {passes:.2f} passes; kept-set diff {keep_diff:.3f}; "
              f"lp err {lp_err:.1e}; {t.label()}")
        rows.append(row(f"sample triton ({kind})", shape, t.ms, nbytes=nbytes, copy_gbs=ctx.copy_gbs, ok=ok,
                        max_err=mism, vs=vs, passes=passes, method=t.method))
    return rows


def _config_case(ctx: Context) -> list[dict]:
    """The default config was chosen from sm_90 compiles only: time a few neighbours."""
    from ignis_kernels.sampling_triton import DEFAULT_CONFIG, sample_triton

    dev = ctx.device.type
    xs = _copies(ROWS, torch.bfloat16, dev, _l2_bytes(dev))
    base = make_params(ROWS, "topk_topp", dev)
    shape = f"{ROWS}x{VOCAB} bfloat16"
    rows = []
    want = sample_triton(xs[0], base)
    for cfg in config_neighbours():
        tokens = sample_triton(xs[0], base, config=cfg)  # the same exact algorithm: the same draws
        t = bench([lambda x=x: sample_triton(x, base, config=cfg) for x in xs])
        label = f"b{cfg.block}/p{cfg.block_p}/np{cfg.num_pivots}/w{cfg.num_warps}/s{cfg.num_stages}"
        default = "; the default" if cfg == DEFAULT_CONFIG else ""
        rows.append(row(f"sample config {label}", shape, t.ms, nbytes=xs[0].numel() * 2, copy_gbs=ctx.copy_gbs,
                        ok=bool(torch.equal(tokens, want)), vs=t.label() + default))
    return rows


def config_neighbours() -> list:  # list[TritonSamplerConfig]
    from ignis_kernels.sampling_triton import DEFAULT_CONFIG, TritonSamplerConfig

    return [DEFAULT_CONFIG,
            TritonSamplerConfig(block=4096, block_p=512, num_warps=16),
            TritonSamplerConfig(block=2048, block_p=256, num_warps=4),
            TritonSamplerConfig(block=2048, block_p=512, num_pivots=4),
            TritonSamplerConfig(block=4096, block_p=256, num_pivots=16, num_warps=16),
            TritonSamplerConfig(block=1024, block_p=128, num_warps=4),
            TritonSamplerConfig(block_p=512)]  # the chunk before 2026-12-01: ~210 registers, 1 program per SM


def _small_case(batch: int, ctx: Context) -> dict:
    """Small batches: one program per row leaves most SMs idle; launch-bound, so graph replay."""
    from ignis_kernels.sampling_triton import sample_triton

    dev = ctx.device.type
    xs = [make_logits(batch, VOCAB, torch.bfloat16, dev, seed=i) for i in range(4)]
    params = make_params(batch, "topk_topp", dev)
    mism, keep_diff, _ = _compare(xs[0], params)
    sort_t = bench([lambda x=x: sort_sampler(x, params.temperature, params.top_k, params.top_p) for x in xs])
    t = bench([lambda x=x: sample_triton(x, params) for x in xs])
    return row("sample triton (topk_topp)", f"{batch}x{VOCAB} bfloat16", t.ms, nbytes=xs[0].numel() * 2,
               copy_gbs=ctx.copy_gbs, ok=mism <= 0.01 and keep_diff <= 0.01, max_err=mism,
               vs=f"torch.sort {sort_t.ms:.3f} ms -> x{sort_t.ms / t.ms:.1f}; {t.label()}", method=t.method)


def cases(ctx: Context) -> list[Case]:
    method = "rotating inputs > 3x L2; graph replay when short"
    return [
        Case("sampling bf16 (baselines + 6 kinds)", f"{ROWS}x{VOCAB} bfloat16",
             lambda c: _dtype_case(torch.bfloat16, c), method, "argmax, softmax+multinomial, torch.sort"),
        Case("sampling fp32 (baselines + 6 kinds)", f"{ROWS}x{VOCAB} float32",
             lambda c: _dtype_case(torch.float32, c), method, "argmax, softmax+multinomial, torch.sort"),
        Case(f"sample configs ({len(config_neighbours())})", f"{ROWS}x{VOCAB} bfloat16", _config_case, method,
             "the default config"),
        Case("sample triton (topk_topp)", f"1x{VOCAB} bfloat16", lambda c: _small_case(1, c), "graph replay",
             "torch.sort"),
        Case("sample triton (topk_topp)", f"32x{VOCAB} bfloat16", lambda c: _small_case(32, c), "graph replay",
             "torch.sort"),
    ]


def dry_run(ctx: Context) -> None:
    """Host side at toy sizes on the CPU: inputs of every kind, the baselines, the reference."""
    from ignis_kernels.sampling_ref import sample_ref

    x = make_logits(4, 512, torch.float32, "cpu")
    for kind in KINDS:
        params = make_params(4, kind, "cpu", vocab=512)
        sample_ref(x, params)
    params = make_params(4, "topk_topp", "cpu", vocab=512)
    sort_sampler(x, params.temperature, params.top_k, params.top_p)
    softmax_multinomial(x, params.temperature)
    x.argmax(-1)
    config_neighbours()
