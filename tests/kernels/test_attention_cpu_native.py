"""The native paged decode attention (ignis_kernels/cpu/decode.cpp through
ignis_kernels.attention_cpu_native.NativeCpuAttention) against kernels' reference."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ignis_kernels import cpu_native, cpu_platform, paged_attention_ref
from ignis_kernels.attention_cpu_native import NativeCpuAttention
from tests.kernels.dense_sinks import dense_sink_attention, random_sinks


@pytest.fixture(scope="module", autouse=True)
def _native_op() -> None:
    if not cpu_native.load():
        pytest.skip("no native CPU decode op on this machine (no C++ compiler?)")


def _case(seq_lens: list[int], q_lens: list[int], *, bs: int = 4, kv_heads: int = 2, heads: int = 6, dim: int = 16,
          seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    counts = [-(-n // bs) for n in seq_lens]
    num_blocks = sum(counts) + 3
    k_cache = torch.randn(num_blocks, bs, kv_heads, dim, generator=g)
    v_cache = torch.randn(num_blocks, bs, kv_heads, dim, generator=g)
    perm = torch.randperm(num_blocks, generator=g)  # scattered blocks: a wrong lookup shows
    width, tables, nxt = max(counts), [], 0
    for c in counts:
        tables.append(perm[nxt : nxt + c].tolist() + [-1] * (width - c))
        nxt += c
    block_tables = torch.tensor(tables, dtype=torch.int32)
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    q = torch.randn(int(qsl[-1]), heads, dim, generator=g)
    d = sum(1 for n in q_lens if n == 1)
    op = NativeCpuAttention(block_tables, qsl, lens, num_decodes=d,
                            decode_max_seq_len=max(seq_lens[:d], default=0), block_size=bs)
    return op, (q, k_cache, v_cache, block_tables, qsl, lens)


@pytest.mark.parametrize("dim", [16, 64])  # the portable loops; AVX-512 tiles where the CPU has them
@pytest.mark.parametrize("window", [None, 5, 300])
@pytest.mark.parametrize("rows", ["lone", "decodes", "decodes+prefill"])
def test_native_decode_attention_matches_reference(window: int | None, rows: str, dim: int) -> None:
    # Lengths around the 256-key work units (split across threads, merged) and the 16-key
    # tiles: 1, 9, 255, 256, 257, 700.
    seq_lens, q_lens = [700, 1, 257, 9, 256, 255], [1] * 6
    if rows == "lone":
        seq_lens, q_lens = [700], [1]
    elif rows == "decodes+prefill":
        seq_lens, q_lens = [*seq_lens, 30, 12], [*q_lens, 5, 12]
    op, args = _case(seq_lens, q_lens, dim=dim)
    got = op(*args, scale=0.3, sliding_window=window)
    want = paged_attention_ref(*args, 0.3, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    out = torch.full_like(args[0], float("nan"))  # the engine's form: fill a given buffer
    op(*args, scale=0.3, sliding_window=window, out=out)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", ["lone", "decodes+prefill"])
def test_bf16_cache(rows: str) -> None:
    """A bf16 cache (engine.kv_cache_dtype) is read as fp32: the same result as the
    reference over the same values widened."""
    seq_lens, q_lens = ([300], [1]) if rows == "lone" else ([300, 5, 40], [1, 1, 7])
    op, (q, k, v, bt, qsl, lens) = _case(seq_lens, q_lens)
    k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    got = op(q, k, v, bt, qsl, lens, scale=0.3, sliding_window=None)
    want = paged_attention_ref(q, k.float(), v.float(), bt, qsl, lens, 0.3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert op._eager is None  # natively, not the eager fallback


@pytest.mark.parametrize("dim", [64, 128])
def test_unrolled_head_dims(dim: int) -> None:
    """The head dims the kernel compiles unrolled, over a bf16 cache, a window, and rows
    longer and shorter than a 256-key unit."""
    op, (q, k, v, bt, qsl, lens) = _case([300, 20, 257], [1, 1, 1], dim=dim, heads=4, kv_heads=2)
    k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    for window in (None, 100):
        got = op(q, k, v, bt, qsl, lens, scale=0.1, sliding_window=window)
        want = paged_attention_ref(q, k.float(), v.float(), bt, qsl, lens, 0.1, window)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _drafted_case(seq_lens: list[int], drafts: list[int], *, dim: int, heads: int = 6, kv_heads: int = 2,
                  seed: int = 0):
    """Sequence i (length seq_lens[i]) checked with a draft of drafts[i] tokens, as the
    runner lays it out: 1 + k one-token rows over the sequence's one block table, of
    lengths n - k, ..., n (each sees the keys the rows before it wrote)."""
    op, (q, k, v, bt, qsl, lens) = _case(seq_lens, [1] * len(seq_lens), dim=dim, heads=heads, kv_heads=kv_heads,
                                         seed=seed)
    tables, row_lens = [], []
    for i, (n, d) in enumerate(zip(seq_lens, drafts)):
        tables += [bt[i]] * (1 + d)
        row_lens += list(range(n - d, n + 1))
    rows = len(row_lens)
    bt, lens = torch.stack(tables).contiguous(), torch.tensor(row_lens, dtype=torch.int32)
    qsl = torch.arange(rows + 1, dtype=torch.int32)
    q = torch.randn(rows, heads, dim, generator=torch.Generator().manual_seed(seed + 1))
    op = NativeCpuAttention(bt, qsl, lens, num_decodes=rows, decode_max_seq_len=max(row_lens), block_size=4)
    return op, (q, k, v, bt, qsl, lens)


@pytest.mark.parametrize("dim", [16, 64, 128])  # the one-row bodies run per row (16); the AVX2 one reads a run's keys once
@pytest.mark.parametrize("window", [None, 5, 300])
def test_draft_rows_share_their_keys(window: int | None, dim: int, cache: str = "float32") -> None:
    """A speculated sequence's rows read the same blocks, so the op reads them once for the
    run: still each row exactly its own keys. Runs across the 256-key units (252..260),
    from one key (1..9), a run longer than the op's 16 (20 rows: split in two), runs side
    by side and between plain rows, with and without sinks."""
    seq_lens, drafts = [260, 30, 9, 700, 40, 300, 255], [8, 0, 8, 3, 19, 4, 1]
    op, (q, k, v, bt, qsl, lens) = _drafted_case(seq_lens, drafts, dim=dim)
    k, v = k.to(getattr(torch, cache)), v.to(getattr(torch, cache))
    got = op(q, k, v, bt, qsl, lens, scale=0.3, sliding_window=window)
    assert op._eager is None
    torch.testing.assert_close(got, paged_attention_ref(q, k.float(), v.float(), bt, qsl, lens, 0.3, window),
                               rtol=1e-5, atol=1e-5)
    sinks = random_sinks(q.shape[1], torch.Generator().manual_seed(dim))
    got = op(q, k, v, bt, qsl, lens, scale=0.3, sliding_window=window, sinks=sinks)
    want = dense_sink_attention(q, k.float(), v.float(), bt, qsl, lens, 0.3, window, sinks)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", [16, 64])
def test_a_draft_row_equals_itself_alone(dim: int) -> None:
    """Speculation's exactness at the op: each row of a run gives the bits that row gives as a
    lone decode row over the same blocks (the step without the draft)."""
    seq_lens, drafts = [260, 700], [8, 5]
    op, (q, k, v, bt, qsl, lens) = _drafted_case(seq_lens, drafts, dim=dim)
    got = op(q, k, v, bt, qsl, lens, scale=0.3, sliding_window=None)
    for r in range(q.shape[0]):
        one = NativeCpuAttention(bt[r : r + 1], qsl[:2], lens[r : r + 1], num_decodes=1,
                                 decode_max_seq_len=int(lens[r]), block_size=4)
        alone = one(q[r : r + 1], k, v, bt[r : r + 1], qsl[:2], lens[r : r + 1], scale=0.3, sliding_window=None)
        assert torch.equal(got[r : r + 1], alone), r


def test_draft_rows_bf16_cache() -> None:
    test_draft_rows_share_their_keys(100, 64, cache="bfloat16")


def test_indices_outside_the_cache_are_refused() -> None:
    """Block ids and lengths are pointer offsets in C++: checked, an error instead of a stray read."""
    op, (q, k, v, bt, qsl, lens) = _case([20, 7], [1, 1])
    bad = bt.clone()
    bad[0, 0] = k.shape[0]  # one past the last block
    with pytest.raises(RuntimeError, match="not a block of the cache"):
        torch.ops.ignis_cpu.paged_decode_attention(q, k, v, bad, lens, 0.3, 0)
    with pytest.raises(RuntimeError, match="outside its block table"):
        torch.ops.ignis_cpu.paged_decode_attention(q, k, v, bt, lens + 1000, 0.3, 0)


def test_one_kv_head_and_wide_groups() -> None:
    op, args = _case([40, 3], [1, 1], kv_heads=1, heads=8, dim=64)
    torch.testing.assert_close(op(*args, scale=None), paged_attention_ref(*args, None), rtol=1e-5, atol=1e-5)


def test_other_dtypes_take_the_eager_path() -> None:
    op, (q, k, v, bt, qsl, lens) = _case([20, 7], [1, 1])
    want = paged_attention_ref(q.double(), k.double(), v.double(), bt, qsl, lens, 0.3)
    got = op(q.double(), k.double(), v.double(), bt, qsl, lens, scale=0.3)
    assert got.dtype == torch.float64 and op._eager is not None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", [16, 64])
@pytest.mark.parametrize("window", [None, 5, 300])
@pytest.mark.parametrize("rows", ["lone", "decodes", "decodes+prefill"])
def test_native_sinks_match_dense(window: int | None, rows: str, dim: int, cache: str = "float32") -> None:
    """Attention sinks (gpt-oss) in the op's merge of a row's 256-key units: against the
    dense formula, rows shorter and longer than a unit, GQA 3, fp32 or bf16 cache (widened
    for the oracle), prefill rows after the decodes (the eager flash path)."""
    seq_lens, q_lens = [700, 1, 257, 9, 256, 255], [1] * 6
    if rows == "lone":
        seq_lens, q_lens = [700], [1]
    elif rows == "decodes+prefill":
        seq_lens, q_lens = [*seq_lens, 30, 12], [*q_lens, 5, 12]
    op, (q, k, v, bt, qsl, lens) = _case(seq_lens, q_lens, dim=dim)
    k, v = k.to(getattr(torch, cache)), v.to(getattr(torch, cache))
    sinks = random_sinks(q.shape[1], torch.Generator().manual_seed(dim))
    got = op(q, k, v, bt, qsl, lens, scale=0.3, sliding_window=window, sinks=sinks)
    assert op._eager is None  # the decode rows went to the native op
    want = dense_sink_attention(q, k.float(), v.float(), bt, qsl, lens, 0.3, window, sinks)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # A sink far below the scores is none: the output without sinks.
    off = op(q, k, v, bt, qsl, lens, scale=0.3, sliding_window=window, sinks=torch.full_like(sinks, -1e4))
    torch.testing.assert_close(off, op(q, k, v, bt, qsl, lens, scale=0.3, sliding_window=window), rtol=1e-5, atol=1e-5)


def test_native_sinks_bf16_cache_and_checks() -> None:
    test_native_sinks_match_dense(100, "decodes+prefill", 64, cache="bfloat16")
    op, (q, k, v, bt, qsl, lens) = _case([20, 7], [1, 1])
    with pytest.raises(RuntimeError, match="sinks must be"):
        torch.ops.ignis_cpu.paged_decode_attention(q, k, v, bt, lens, 0.3, 0, torch.zeros(q.shape[1] - 1))


TIERS_BELOW = [t for t in ("avx2", "portable") if cpu_platform.LEVELS.index(t) < cpu_platform.LEVELS.index(
    cpu_platform.current().host_level)]


@pytest.mark.slow
@pytest.mark.parametrize("tier", TIERS_BELOW or ["portable"])
def test_every_tier_below_the_host(tier: str, tmp_path: Path) -> None:
    """What a CPU of a lower tier runs (AVX2+FMA tiles; portable loops on aarch64 and older
    x86), for every head dim: the op built under IGNIS_CPU_CAPS=tier, in a fresh process,
    through the tests above. Its machine code holds no instruction above the tier: no
    AVX-512 (zmm) registers for avx2, no AVX (ymm) at all for portable."""
    if tier not in TIERS_BELOW:
        pytest.skip(f"this CPU is {cpu_platform.current().host_level}: no tier below it to cap to")
    script = """
from ignis_kernels import cpu_native
assert cpu_native.load()
print(cpu_native.library_path())
import tests.kernels.test_attention_cpu_native as t
for dim in (16, 64, 128):
    for window in (None, 5, 300):
        for rows in ("lone", "decodes", "decodes+prefill"):
            t.test_native_decode_attention_matches_reference(window, rows, dim)
t.test_bf16_cache("decodes+prefill")
t.test_unrolled_head_dims(64)
t.test_unrolled_head_dims(128)
t.test_one_kv_head_and_wide_groups()
for dim in (16, 64, 128):
    for window in (None, 5):
        t.test_native_sinks_match_dense(window, "decodes+prefill", dim)
t.test_native_sinks_bf16_cache_and_checks()
for dim in (16, 64, 128):
    for window in (None, 5):
        t.test_draft_rows_share_their_keys(window, dim)
t.test_draft_rows_bf16_cache()
"""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "IGNIS_CPU_CAPS": tier, "IGNIS_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lib = Path(proc.stdout.split()[0])
    code = lib.read_bytes()
    assert b"attend_unit_avx512" not in code
    assert (b"attend_unit_avx2" in code) == (tier == "avx2")
    objdump = shutil.which("objdump")
    if objdump is not None:
        asm = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True,
                             check=True).stdout
        assert "zmm" not in asm
        assert ("ymm" in asm) == (tier == "avx2")
