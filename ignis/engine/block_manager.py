"""Paged KV-cache bookkeeping: fixed-size blocks, reference counts, a prefix cache.

A block holds block_size consecutive tokens of one or more sequences (shared blocks
are prefixes). Prefix cache: every *full* block whose K/V is computed is published
under a hash chain, hash(parent_hash, its token ids), so a block's key names the
whole prefix up to its end. A new sequence walks its own chain and takes every block
it finds, skipping their prefill.

Free blocks: reference count 0. They sit in one LRU queue whether or not they are
still published; a published free block is a cache entry that costs nothing until a
fresh allocation takes it from the head of the queue (evicting its hash). Freed
blocks join at the tail (kept longest) if published, at the head if not (nothing to
keep), and a sequence frees its blocks last-first so that a prefix outlives its
continuations. num_free_blocks therefore counts evictable cache entries too.
"""

from __future__ import annotations

from collections import OrderedDict

from ignis.engine.sequence import Sequence

_ROOT_HASH = 0x1F2E3D4C


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("need at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # head = evicted first
        self.cached: dict[int, int] = {}  # hash -> block id
        # Gauges: prompt tokens looked up in / found in the prefix cache (first admissions).
        self.query_tokens = 0
        self.hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    # -- hashing --------------------------------------------------------------------

    def _extend_hashes(self, seq: Sequence, num_blocks: int) -> None:
        """Make seq.block_hashes cover its first num_blocks full blocks."""
        bs, hashes, ids = self.block_size, seq.block_hashes, seq.token_ids
        parent = hashes[-1] if hashes else _ROOT_HASH
        for i in range(len(hashes), num_blocks):
            parent = hash((parent, tuple(ids[i * bs : (i + 1) * bs])))
            hashes.append(parent)

    # -- admission ----------------------------------------------------------------

    def admit(self, seq: Sequence, num_new_tokens_cap: int) -> int | None:
        """Give a waiting sequence its cached prefix plus blocks for its next tokens.

        Returns how many tokens it will compute this step (>= 1, <= num_new_tokens_cap),
        or None when the free blocks cannot hold them (nothing is changed then). At least
        the last known token is always computed: its logits are what the step samples from.
        """
        bs = self.block_size
        hit: list[int] = []
        if self.enable_prefix_caching:
            max_hit = (seq.num_tokens - 1) // bs
            self._extend_hashes(seq, max_hit)
            for i in range(max_hit):
                block = self.cached.get(seq.block_hashes[i])
                if block is None or self.block_tokens[block] != tuple(seq.token_ids[i * bs : (i + 1) * bs]):
                    break
                hit.append(block)
        computed = len(hit) * bs
        num_new = min(seq.num_tokens - computed, num_new_tokens_cap)
        need = -(-(computed + num_new) // bs) - len(hit)
        reusable_free = sum(1 for b in hit if self.ref_counts[b] == 0)
        if need > self.num_free_blocks - reusable_free:
            return None
        for b in hit:
            if self.ref_counts[b] == 0:
                del self.free[b]
            self.ref_counts[b] += 1
        seq.block_table = hit + [self._take_free() for _ in range(need)]
        seq.num_computed_tokens = computed
        seq.num_published_blocks = len(hit)
        if seq.num_cached_tokens is None:  # usage reports the first admission
            seq.num_cached_tokens = computed
            self.query_tokens += seq.num_tokens
            self.hit_tokens += computed
        return num_new

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Make seq's block table cover num_tokens tokens; False (no change) if out of blocks."""
        need = -(-num_tokens // self.block_size) - len(seq.block_table)
        if need <= 0:
            return True
        if need > self.num_free_blocks:
            return False
        seq.block_table.extend(self._take_free() for _ in range(need))
        return True

    def _take_free(self) -> int:
        block, _ = self.free.popitem(last=False)
        h = self.block_hash[block]
        if h is not None:  # evict the cache entry this block held
            if self.cached.get(h) == block:
                del self.cached[h]
            self.block_hash[block] = None
            self.block_tokens[block] = None
        self.ref_counts[block] = 1
        return block

    # -- publishing and freeing -------------------------------------------------------

    def publish(self, seq: Sequence) -> None:
        """Register seq's full, computed blocks in the prefix cache (call after each step)."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if full <= seq.num_published_blocks:
            return
        self._extend_hashes(seq, full)
        bs = self.block_size
        for i in range(seq.num_published_blocks, full):
            block, h = seq.block_table[i], seq.block_hashes[i]
            # Two sequences may have computed the same prefix at once: the first one wins,
            # the other block simply stays unpublished.
            if h not in self.cached and self.block_hash[block] is None:
                self.cached[h] = block
                self.block_hash[block] = h
                self.block_tokens[block] = tuple(seq.token_ids[i * bs : (i + 1) * bs])
        seq.num_published_blocks = full

    def release(self, seq: Sequence) -> None:
        """Publish what seq computed, then drop its references (finish, abort, preempt)."""
        self.publish(seq)
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free[block] = None
                if self.block_hash[block] is None:
                    self.free.move_to_end(block, last=False)  # nothing cached: reuse first
            elif self.ref_counts[block] < 0:
                raise AssertionError(f"block {block} freed twice")
        seq.block_table = []
        seq.num_published_blocks = 0

    def check(self, live: list[Sequence]) -> None:
        """Assert the bookkeeping is consistent with the live sequences (tests, debugging)."""
        refs = [0] * self.num_blocks
        for seq in live:
            for block in seq.block_table:
                refs[block] += 1
        assert refs == self.ref_counts, "reference counts disagree with the block tables"
        assert set(self.free) == {b for b in range(self.num_blocks) if refs[b] == 0}, "free queue is wrong"
        for h, block in self.cached.items():
            assert self.block_hash[block] == h, f"cache entry {h} -> {block} is stale"
