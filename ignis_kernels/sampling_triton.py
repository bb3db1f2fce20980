"""Sort-free batched sampling in Triton: one program per row, looping over the vocab.

Same definition as ignis_kernels.sampling_ref (read its docstring); the kernel finds the
top-k / top-p thresholds by pivot search instead of sorting. Passes over a row:

  A    always: max, first argmax, min of finite values (and, for logprobs, the online
       sum of exp((x-max)/T)). Greedy rows stop here; rows with no top-k/top-p/min-p also run the Gumbel race
       in this pass, so plain temperature sampling is ONE pass.
  S    pivot passes (top-k first, then top-p over the survivors): NP pivots spread over
       the current data interval [L, H]; per pivot the count (and, for top-p, the mass
       of q = exp((x-max)/T)) of elements >= pivot, the smallest element >= it and the
       largest element < it. The answer (the threshold tau, an element value; keep
       x >= tau) lies in the bucket where the predicate flips, whose data range is read
       off those min/max, so every pass shrinks [L, H] to real values and stops when it
       holds one distinct value: exact, ties at the threshold included.
  C    once count(x >= L) <= CAP: the next full pass also copies those elements (value
       and token id, in token order) to a per-row scratch; later pivot passes and the
       race then read only that (in L2, a few KB). If only the bucket [L, H] fits, it is
       copied with the counts above H kept as constants (top-p-heavy rows).
  R    the race over x >= tau: on the copied candidates, or a full pass when they do
       not hold the whole kept set.

Every pass keeps its statistics per lane (running max and first argmax, min, softmax
sum, per-pivot count/mass/min/max, the race's best key and position) and reduces them
once after its loop, so a chunk costs elementwise work and its load, with no block-wide
reduction or barrier (only the compacting pass scans each chunk); the next chunk's load
is issued before the current one is worked on.

Typical top-k/top-p row: A + one full pivot pass + one full pass that also compacts +
a few candidate passes + a race on the candidates: three passes over the logits.
min_p alone needs no search (tau = max + T*log(min_p)): two passes. MAX_ITERS bounds
the pivot passes per stage; hitting it (pathological data only) keeps x >= L, a
superset of the exact set.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ignis_kernels.sampling_penalties import apply_penalties_
from ignis_kernels.sampling_tensors import GREEDY_EPS, SamplingTensors

_NEG_INF = tl.constexpr(float("-inf"))
_POS_INF = tl.constexpr(float("inf"))


@dataclass(frozen=True)
class TritonSamplerConfig:
    # 8 warps: two programs per SM, so 256 rows run in one wave on an H200 (132 SMs).
    # Compile-checked for sm_90 without spills (experiments/RESULTS.md); not yet timed.
    block: int = 2048  # chunk of the 1-D passes (A, R)
    # Chunk of the pivot passes: [block_p, num_pivots] tiles, four of them kept per lane
    # across the pass (512 would need ~200 registers a thread: one program per SM).
    block_p: int = 256
    num_pivots: int = 8  # NP, a power of two >= 4
    cap: int = 4096  # candidate scratch per row
    max_iters: int = 32  # pivot passes per stage before falling back to x >= L
    num_warps: int = 8
    # Passed to the launch (Triton's default); the pipeliner gives these loads no buffers
    # (they feed no dot): the kernel's own one-chunk prefetch keeps a load in flight.
    num_stages: int = 3

    def __post_init__(self) -> None:
        # Fewer than 4 pivots would not split the interval (pivots 0 and NP-1 are its ends).
        for name in ("block", "block_p", "num_pivots", "cap"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, got {v}")
        if self.num_pivots < 4:
            raise ValueError("num_pivots must be >= 4")


DEFAULT_CONFIG = TritonSamplerConfig()


@triton.jit
def _mix32(x):
    # lowbias32 on uint32 (wrapping multiplies); same as ignis_kernels.sampling_ref.mix32.
    x = x ^ (x >> 16)
    x = x * tl.full([], 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full([], 0x846CA68B, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _row_keys(seed, step):
    s_lo = seed.to(tl.uint32)
    s_hi = (seed >> 32).to(tl.uint32)
    t_lo = step.to(tl.uint32)
    t_hi = (step >> 32).to(tl.uint32)
    h = _mix32(s_hi ^ tl.full([], 0x243F6A88, tl.uint32))
    h = _mix32(h ^ s_lo)
    h = _mix32(h ^ t_hi ^ tl.full([], 0x13198A2E, tl.uint32))
    h = _mix32(h ^ t_lo)
    return h, _mix32(h ^ tl.full([], 0x03707344, tl.uint32))


@triton.jit
def _gumbel(token, k0, k1):
    v = _mix32((token.to(tl.uint32) * tl.full([], 0x9E3779B1, tl.uint32)) ^ k0)
    v = _mix32(v + k1)
    u = ((v >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23: 0 < u < 1 exactly
    return -tl.log(-tl.log(u))


@triton.jit
def _first_max(val, idx):
    """Reduce per-lane running bests once: (max of val, the smallest idx holding it). Each
    lane kept its first (lowest-index) best, so this is the row's first best."""
    vmax = tl.max(val, 0)
    return vmax, tl.min(tl.where(val == vmax, idx, 2147483647), 0)


@triton.jit
def _pick(vec, jj, j):
    # vec[j] for a runtime j (exactly one lane survives the where, so +-inf pass through).
    return tl.sum(tl.where(jj == j, vec, tl.zeros_like(vec)), 0)


@triton.jit
def _pivot_stats(src, n, piv, m, inv_t, need_mass, do_write, wlo, whi, dst_x, dst_i,
                 BLOCK: tl.constexpr, NP: tl.constexpr):
    """Per pivot over src[0:n]: count and mass of x >= piv, min of x >= piv, max of x < piv.
    With do_write, also append the x in [wlo, whi] (and their positions) to dst.

    The statistics accumulate per lane in [BLOCK, NP] tiles and are reduced once, after
    the loop: a chunk costs elementwise work only (no block-wide reduction, no barrier),
    except the compaction's running position on the one pass that copies."""
    cnt = tl.zeros([BLOCK, NP], tl.int32)
    mass = tl.zeros([BLOCK, NP], tl.float32)
    amin = tl.full([BLOCK, NP], _POS_INF, tl.float32)
    bmax = tl.full([BLOCK, NP], _NEG_INF, tl.float32)
    nw = tl.full([], 0, tl.int32)
    lanes = tl.arange(0, BLOCK)
    x_next = tl.load(src + lanes, mask=lanes < n, other=_NEG_INF)
    for start in range(0, n, BLOCK):
        offs = start + lanes
        x = x_next.to(tl.float32)
        # The next chunk's load is issued before this chunk's work: one chunk always in flight.
        x_next = tl.load(src + offs + BLOCK, mask=offs + BLOCK < n, other=_NEG_INF)
        ge = x[:, None] >= piv[None, :]
        cnt += ge.to(tl.int32)
        amin = tl.minimum(amin, tl.where(ge, x[:, None], _POS_INF))
        bmax = tl.maximum(bmax, tl.where(ge, _NEG_INF, x[:, None]))
        if need_mass:
            q = tl.where(x > _NEG_INF, tl.exp((x - m) * inv_t), 0.0)
            mass += tl.where(ge, q[:, None], 0.0)
        if do_write:
            sel = (x >= wlo) & (x <= whi)
            pos = nw + tl.cumsum(sel.to(tl.int32), 0) - 1
            tl.store(dst_x + pos, x, mask=sel)
            tl.store(dst_i + pos, offs, mask=sel)
            nw += tl.sum(sel.to(tl.int32), 0)
    return tl.sum(cnt, 0), tl.sum(mass, 0), tl.min(amin, 0), tl.max(bmax, 0), nw


@triton.jit
def _race(src, src_idx, n, tau, inv_t, k0, k1, FROM_CAND: tl.constexpr, BLOCK: tl.constexpr):
    """Gumbel race over the x >= tau in src[0:n]: (token id, its x); ties -> lowest id.
    Per-lane running winners (key and position), reduced once after the loop; the
    winner's id and x are read back from memory (fewer registers than carrying them)."""
    best = tl.full([BLOCK], _NEG_INF, tl.float32)
    best_at = tl.zeros([BLOCK], tl.int32)
    lanes = tl.arange(0, BLOCK)
    x_next = tl.load(src + lanes, mask=lanes < n, other=_NEG_INF)
    for start in range(0, n, BLOCK):
        offs = start + lanes
        mask = offs < n
        x = x_next.to(tl.float32)
        x_next = tl.load(src + offs + BLOCK, mask=offs + BLOCK < n, other=_NEG_INF)  # prefetch
        if FROM_CAND:
            tok = tl.load(src_idx + offs, mask=mask, other=0)
        else:
            tok = offs
        key = tl.where(x >= tau, x * inv_t + _gumbel(tok, k0, k1), _NEG_INF)
        take = key > best  # strict: a lane keeps its earliest (lowest-id) winner
        best = tl.where(take, key, best)
        best_at = tl.where(take, offs, best_at)
    # Candidates are stored in token order, so the lowest position is the lowest id.
    _, at = _first_max(best, best_at)
    x_win = tl.load(src + at).to(tl.float32)
    if FROM_CAND:
        return tl.load(src_idx + at), x_win
    return at, x_win


@triton.jit
def _threshold(x_ptr, V, cx_ptr, ci_ptr, m, inv_t, floor, top_k, top_p, k_on, p_on,
               BLOCK_P: tl.constexpr, NP: tl.constexpr, CAP: tl.constexpr, MAX_ITERS: tl.constexpr):
    """The keep threshold tau (keep x >= tau) of a filtered row, and where its candidates are:
    returns (tau, cmode, n_c, full, cand) with cmode 1 when cx/ci[0:n_c] hold every
    x >= tau, and the numbers of full-row and candidate pivot passes it made."""
    jj = tl.arange(0, NP)
    frac = jj.to(tl.float32) / (NP - 1)
    tau = floor
    stage = tl.where(k_on, 0, tl.where(p_on, 1, 2))  # 0 top-k, 1 top-p, 2 done
    lo = floor
    hi = m
    cmode = tl.full([], 0, tl.int32)  # 0 none, 1 all x >= wlo copied, 2 only [wlo, whi]
    pend = tl.where(V <= CAP, 1, 0)  # compaction the next full pass performs
    n_c = tl.full([], 0, tl.int32)
    base_c = tl.full([], 0, tl.int32)  # count / mass above the copied bucket (cmode 2)
    base_m = tl.full([], 0.0, tl.float32)
    cnt_hi = tl.full([], 0, tl.int32)
    mass_hi = tl.full([], 0.0, tl.float32)
    target = tl.full([], 0.0, tl.float32)
    first = tl.full([], 1, tl.int32)
    it = tl.full([], 0, tl.int32)
    full = tl.full([], 0, tl.int32)
    cand = tl.full([], 0, tl.int32)
    while stage < 2:
        piv = tl.where(jj == NP - 1, hi, lo + (hi - lo) * frac)
        need_mass = stage == 1
        if cmode > 0:
            cnt, mass, amin, bmax, nw = _pivot_stats(cx_ptr, n_c, piv, m, inv_t, need_mass, False,
                                                     lo, hi, cx_ptr, ci_ptr, BLOCK_P, NP)
            cnt += base_c
            mass += base_m
            cand += 1
        else:
            whi = tl.where(pend == 2, hi, _POS_INF)
            cnt, mass, amin, bmax, nw = _pivot_stats(x_ptr, V, piv, m, inv_t, need_mass, pend > 0,
                                                     lo, whi, cx_ptr, ci_ptr, BLOCK_P, NP)
            full += 1
            if pend > 0:
                cmode = pend
                n_c = nw
                base_c = tl.where(pend == 2, cnt_hi, 0)
                base_m = tl.where(pend == 2, mass_hi, 0.0)
                pend = tl.full([], 0, tl.int32)
        if first == 1:
            target = top_p * _pick(mass, jj, 0)  # pivot 0 is the top-p floor: Z of the survivors
            first = tl.full([], 0, tl.int32)
        pred = tl.where(stage == 0, cnt >= top_k, mass >= target)
        a = tl.max(tl.where(pred, jj, -1), 0)  # last pivot where the predicate holds
        it += 1
        fin = a < 0  # fails at lo itself (top-k: fewer than k tokens above the floor)
        ans = lo
        cnt_ans = _pick(cnt, jj, 0)
        if a == NP - 1:  # holds at hi, the largest value of the interval
            fin = a == NP - 1
            ans = hi
            cnt_ans = _pick(cnt, jj, NP - 1)
        elif a >= 0:
            # The answer lies in the bucket [piv_a, piv_a+1): shrink to its data range.
            new_lo = _pick(amin, jj, a)
            new_hi = _pick(bmax, jj, a + 1)
            ans = new_lo
            cnt_ans = _pick(cnt, jj, a)
            # One distinct value left: done. Out of passes: keep x >= lo (a superset).
            fin = (new_lo >= new_hi) | (it >= MAX_ITERS)
            if new_lo < new_hi:
                lo = new_lo
                hi = new_hi
                cnt_hi = _pick(cnt, jj, a + 1)
                mass_hi = _pick(mass, jj, a + 1)
                if cmode == 0:
                    pend = tl.where(cnt_ans <= CAP, 1, tl.where(cnt_ans - cnt_hi <= CAP, 2, 0))
        if fin:
            tau = ans
            if (stage == 0) & p_on:
                stage = tl.full([], 1, tl.int32)
                lo = ans
                hi = m
                first = tl.full([], 1, tl.int32)
                it = tl.full([], 0, tl.int32)
                if cmode == 2:  # the copied bucket need not cover [tau, max]
                    cmode = tl.full([], 0, tl.int32)
                pend = tl.where((cmode == 0) & (cnt_ans <= CAP), 1, 0)
            else:
                stage = tl.full([], 2, tl.int32)
    return tau, cmode, n_c, full, cand


@triton.jit
def _sample_kernel(
    x_base, stride_b, V,
    temp_ptr, topk_ptr, topp_ptr, minp_ptr, seed_ptr, step_ptr,
    cx_base, ci_base, tok_ptr, lp_ptr, dbg_tau_ptr, dbg_pass_ptr,
    BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, NP: tl.constexpr, CAP: tl.constexpr,
    MAX_ITERS: tl.constexpr, GREEDY_EPS: tl.constexpr, LOGPROBS: tl.constexpr, DEBUG: tl.constexpr,
):
    row = tl.program_id(0)
    x_ptr = x_base + row.to(tl.int64) * stride_b
    cx_ptr = cx_base + row.to(tl.int64) * CAP
    ci_ptr = ci_base + row.to(tl.int64) * CAP

    temp = tl.load(temp_ptr + row).to(tl.float32)
    top_k = tl.load(topk_ptr + row).to(tl.int32)
    top_p = tl.load(topp_ptr + row).to(tl.float32)
    min_p = tl.load(minp_ptr + row).to(tl.float32)
    k0, k1 = _row_keys(tl.load(seed_ptr + row).to(tl.int64), tl.load(step_ptr + row).to(tl.int64))

    sampled = temp >= GREEDY_EPS
    inv_t = tl.where(sampled, 1.0 / tl.maximum(temp, GREEDY_EPS), 1.0)
    k_on = (top_k > 0) & (top_k < V)
    p_on = top_p < 1.0
    mp_on = min_p > 0.0
    filtered = sampled & (k_on | p_on | mp_on)
    fused = sampled & ~(k_on | p_on | mp_on)

    # Pass A (+ the race itself for unfiltered sampled rows). Per-lane running max (and
    # the first index reaching it), min, softmax denominator and race winner, reduced
    # once after the loop: a chunk is elementwise work on BLOCK lanes and its load.
    lanes = tl.arange(0, BLOCK)
    m_v = tl.full([BLOCK], _NEG_INF, tl.float32)
    s_v = tl.zeros([BLOCK], tl.float32)
    xmin_v = tl.full([BLOCK], _POS_INF, tl.float32)
    tok_v = tl.zeros([BLOCK], tl.int32)
    best_v = tl.full([BLOCK], _NEG_INF, tl.float32)
    best_i_v = tl.zeros([BLOCK], tl.int32)
    x_next = tl.load(x_ptr + lanes, mask=lanes < V, other=_NEG_INF)
    for start in range(0, V, BLOCK):
        offs = start + lanes
        x = x_next.to(tl.float32)
        # Prefetch: the next chunk's load is in flight while this one is worked on.
        x_next = tl.load(x_ptr + offs + BLOCK, mask=offs + BLOCK < V, other=_NEG_INF)
        finite = x > _NEG_INF
        tok_v = tl.where(x > m_v, offs, tok_v)
        m_new = tl.maximum(m_v, x)
        if LOGPROBS:  # online softmax denominator per lane; sampling itself never needs it
            # Lanes still at -inf (no finite value yet) contribute 0 and rescale by 0.
            grew = m_new > m_v
            safe = tl.where(m_new > _NEG_INF, m_new, 0.0)
            alpha = tl.exp((tl.where(grew, m_v, safe) - safe) * inv_t)
            s_v = s_v * alpha + tl.where(finite, tl.exp((x - safe) * inv_t), 0.0)
        m_v = m_new
        xmin_v = tl.minimum(xmin_v, tl.where(finite, x, _POS_INF))
        if fused:
            key = x * inv_t + _gumbel(offs, k0, k1)
            take = key > best_v
            best_v = tl.where(take, key, best_v)
            best_i_v = tl.where(take, offs, best_i_v)
    m, tok = _first_max(m_v, tok_v)  # the row's max and its first argmax
    xmin = tl.min(xmin_v, 0)
    x_tok = m
    if LOGPROBS:
        live = m_v > _NEG_INF
        s = tl.sum(tl.where(live, s_v * tl.exp((tl.where(live, m_v, m) - m) * inv_t), 0.0), 0)
    if fused:
        _, tok = _first_max(best_v, best_i_v)
        x_tok = tl.load(x_ptr + tok).to(tl.float32)

    tau = tl.where(sampled, xmin, m)  # what a debug caller sees for rows without a search
    n_full = tl.full([], 0, tl.int32)
    n_cand = tl.full([], 0, tl.int32)
    n_race = tl.full([], 0, tl.int32)
    if filtered:
        off = tl.where(mp_on, temp * tl.log(tl.where(mp_on, min_p, 1.0)), _NEG_INF)
        floor = tl.maximum(xmin, m + off)
        tau, cmode, n_c, n_full, n_cand = _threshold(x_ptr, V, cx_ptr, ci_ptr, m, inv_t, floor, top_k, top_p, k_on, p_on,
                                     BLOCK_P, NP, CAP, MAX_ITERS)
        if cmode == 1:
            tok, x_tok = _race(cx_ptr, ci_ptr, n_c, tau, inv_t, k0, k1, True, BLOCK_P)
        else:
            tok, x_tok = _race(x_ptr, ci_ptr, V, tau, inv_t, k0, k1, False, BLOCK)
            n_race = tl.full([], 1, tl.int32)
    if DEBUG:
        tl.store(dbg_tau_ptr + row, tau)
        tl.store(dbg_pass_ptr + 3 * row, n_full)
        tl.store(dbg_pass_ptr + 3 * row + 1, n_cand)
        tl.store(dbg_pass_ptr + 3 * row + 2, n_race)
    tl.store(tok_ptr + row, tok.to(tl.int64))
    if LOGPROBS:
        tl.store(lp_ptr + row, (x_tok - m) * inv_t - tl.log(s))


def _launch(x: torch.Tensor, params: SamplingTensors, cfg: TritonSamplerConfig, logprobs: bool, debug: bool):
    B, V = x.shape
    dev = x.device
    tokens = torch.empty(B, dtype=torch.int64, device=dev)
    lps = torch.empty(B if logprobs else 1, dtype=torch.float32, device=dev)
    dbg_tau = torch.empty(B if debug else 1, dtype=torch.float32, device=dev)
    dbg_pass = torch.zeros(B if debug else 1, 3, dtype=torch.int32, device=dev)
    if B > 0:
        cand_x = torch.empty(B, cfg.cap, dtype=torch.float32, device=dev)
        cand_i = torch.empty(B, cfg.cap, dtype=torch.int32, device=dev)
        _sample_kernel[(B,)](
            x, x.stride(0), V,
            params.temperature, params.top_k, params.top_p, params.min_p, params.seed, params.step,
            cand_x, cand_i, tokens, lps, dbg_tau, dbg_pass,
            BLOCK=cfg.block, BLOCK_P=cfg.block_p, NP=cfg.num_pivots, CAP=cfg.cap,
            MAX_ITERS=cfg.max_iters, GREEDY_EPS=GREEDY_EPS, LOGPROBS=logprobs, DEBUG=debug,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return tokens, lps, dbg_tau, dbg_pass


def _penalised(logits: torch.Tensor, params: SamplingTensors, inplace: bool) -> torch.Tensor:
    x = logits
    if params.has_penalty_tokens:
        if not (inplace and x.dtype == torch.float32 and x.stride(1) == 1):
            x = x.to(torch.float32, copy=True)
        apply_penalties_(x, params)
    return x if x.stride(1) == 1 else x.contiguous()


def sample_triton(
    logits: torch.Tensor,
    params: SamplingTensors,
    *,
    return_logprobs: bool = False,
    inplace_penalties: bool = False,
    config: TritonSamplerConfig | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same contract as sample_ref. With penalty tokens the kernel reads a float32 copy,
    or, when `inplace_penalties` and logits are float32, `logits` penalised in place."""
    x = _penalised(logits, params, inplace_penalties)
    tokens, logprobs, _, _ = _launch(x, params, config or DEFAULT_CONFIG, return_logprobs, debug=False)
    return (tokens, logprobs) if return_logprobs else tokens


def sample_triton_debug(
    logits: torch.Tensor, params: SamplingTensors, config: TritonSamplerConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For tests and benchmarks: (tokens, tau [B], passes [B, 3]). A sampled row may draw
    exactly the tokens with x >= tau (x = penalised float32 logits); passes counts the
    full-row and the candidate pivot passes of its threshold search, and (0 or 1) whether
    its race read the full row. Passes over the vocabulary: 1 (pass A) + [:, 0] + [:, 2]."""
    x = _penalised(logits, params, inplace=False)
    tokens, _, tau, passes = _launch(x, params, config or DEFAULT_CONFIG, logprobs=False, debug=True)
    return tokens, tau, passes
