"""Block manager and scheduler bookkeeping, without a model."""

from __future__ import annotations

from ignis.engine.block_manager import BlockManager
from ignis.engine.sampling_params import SamplingParams
from ignis.engine.scheduler import Scheduler
from ignis.engine.sequence import Sequence, Status

BS = 4


def seq(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, tokens, SamplingParams.greedy(8), seed=0, max_tokens=8, text=None)


def run_prefill(bm: BlockManager, s: Sequence, cap: int = 1000) -> int:
    """Admit s and pretend its whole known context was computed in one step."""
    n = bm.admit(s, cap)
    assert n is not None
    s.num_computed_tokens += n
    bm.publish(s)
    return n


def test_admit_allocates_and_release_returns_every_block() -> None:
    bm = BlockManager(8, BS)
    s = seq("a", list(range(10)))
    assert run_prefill(bm, s) == 10
    assert len(s.block_table) == 3 and bm.num_free_blocks == 5
    assert [bm.ref_counts[b] for b in s.block_table] == [1, 1, 1]
    bm.release(s)
    assert bm.num_free_blocks == 8 and s.block_table == []
    assert all(r == 0 for r in bm.ref_counts)


def test_prefix_hit_covers_shared_full_blocks_only() -> None:
    bm = BlockManager(16, BS)
    a = seq("a", list(range(11)))  # blocks [0-3] [4-7] full, [8-10] partial
    run_prefill(bm, a)
    bm.release(a)
    b = seq("b", list(range(9)) + [99, 98, 97])  # shares 9 tokens: two full blocks
    n = bm.admit(b, 1000)
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8 and n == 4
    assert bm.hit_tokens == 8 and bm.query_tokens == 11 + 12


def test_full_hit_still_computes_the_last_token() -> None:
    bm = BlockManager(16, BS)
    a = seq("a", list(range(8)))
    run_prefill(bm, a)
    bm.release(a)
    b = seq("b", list(range(8)))  # identical prompt, two full blocks
    assert bm.admit(b, 1000) == 4  # the last block is recomputed: its logits are needed
    assert b.num_cached_tokens == 4


def test_shared_blocks_are_reference_counted() -> None:
    bm = BlockManager(16, BS)
    a = seq("a", list(range(9)))
    run_prefill(bm, a)  # a keeps running: its two full blocks are published, still referenced
    b = seq("b", list(range(8)) + [50, 51])
    bm.admit(b, 1000)
    shared = a.block_table[:2]
    assert b.block_table[:2] == shared and [bm.ref_counts[x] for x in shared] == [2, 2]
    bm.release(a)
    assert [bm.ref_counts[x] for x in shared] == [1, 1]
    bm.release(b)
    assert bm.num_free_blocks == 16


def test_hash_chain_names_the_whole_prefix() -> None:
    bm = BlockManager(16, BS)
    a = seq("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    run_prefill(bm, a)
    bm.release(a)
    b = seq("b", [0, 0, 0, 0, 5, 6, 7, 8, 9])  # same second block, different first
    bm.admit(b, 1000)
    assert b.num_cached_tokens == 0


def test_lru_eviction_keeps_recent_prefixes() -> None:
    bm = BlockManager(4, BS)
    a = seq("a", list(range(5)))  # one full block + partial
    run_prefill(bm, a)
    bm.release(a)
    b = seq("b", list(range(100, 105)))
    run_prefill(bm, b)
    bm.release(b)
    # Both prefixes are cached in free blocks; a new sequence needing 3 blocks evicts the
    # unpublished partial blocks first, then the least recently freed cached block (a's).
    c = seq("c", list(range(200, 211)))
    run_prefill(bm, c)
    bm.release(c)
    d = seq("d", list(range(100, 105)))
    bm.admit(d, 1000)
    assert d.num_cached_tokens == 4  # b's block survived
    e = seq("e", list(range(5)))
    bm.release(d)
    bm.admit(e, 1000)
    assert e.num_cached_tokens == 0  # a's was evicted


def test_admit_refuses_without_changing_state() -> None:
    bm = BlockManager(2, BS)
    s = seq("a", list(range(12)))
    assert bm.admit(s, 1000) is None
    assert bm.num_free_blocks == 2 and s.block_table == [] and s.num_cached_tokens is None
    assert bm.admit(s, 8) == 8  # a smaller chunk fits


def test_scheduler_budget_chunks_and_mixes_decodes() -> None:
    bm = BlockManager(64, BS)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=10)
    a, b = seq("a", list(range(3))), seq("b", list(range(20)))
    sch.add(a)
    sch.add(b)
    batch = sch.schedule()
    assert [s.request_id for s in batch.seqs] == ["a", "b"] and batch.num_new_tokens == [3, 7]
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        s.num_computed_tokens += n
    a.token_ids.append(5)  # a sampled a token; b's prefill continues in chunks
    batch = sch.schedule()
    assert batch.num_new_tokens == [1, 9]


def test_scheduler_max_num_seqs_and_fifo() -> None:
    bm = BlockManager(64, BS)
    sch = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=100)
    seqs = [seq(str(i), [i] * 3) for i in range(4)]
    for s in seqs:
        sch.add(s)
    batch = sch.schedule()
    assert [s.request_id for s in batch.seqs] == ["0", "1"]
    assert [s.request_id for s in sch.waiting] == ["2", "3"]


def test_scheduler_preempts_the_latest_admitted() -> None:
    bm = BlockManager(4, BS)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    a, b = seq("a", list(range(8))), seq("b", list(range(10, 18)))
    sch.add(a)
    sch.add(b)
    batch = sch.schedule()
    assert len(batch.seqs) == 2 and bm.num_free_blocks == 0
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        s.num_computed_tokens += n
        s.token_ids.append(1)
    batch = sch.schedule()  # a needs a third block: b is preempted
    assert [s.request_id for s in batch.seqs] == ["a"] and batch.preempted == [b]
    assert b.status is Status.WAITING and b.num_computed_tokens == 0 and list(sch.waiting) == [b]
    assert sch.num_preemptions == 1


def test_recompute_after_preemption_hits_its_own_blocks() -> None:
    bm = BlockManager(8, BS)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    s = seq("a", list(range(10)))
    sch.add(s)
    batch = sch.schedule()
    s.num_computed_tokens += batch.num_new_tokens[0]
    sch._preempt(sch.running.pop())  # what the scheduler does when blocks run out
    assert bm.num_free_blocks == 8
    batch = sch.schedule()
    assert batch.seqs == [s] and s.num_computed_tokens == 8 and batch.num_new_tokens == [2]
