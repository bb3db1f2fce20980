"""Speculative decoding by prompt lookup (ignis/engine/ngram.py, speculation.py): the output is
exactly plain decoding's (greedy and seeded token for token, unseeded in distribution), with
stop strings, max_tokens, logprobs, the prefix cache, preemption and output grammars (a draft
cut at the grammar's first refusal, each position under the mask after the draft before it);
rows it must not draft for (penalties, min_tokens, slow grammars) get no draft."""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest

from ignis.config import EngineConfig
from ignis.engine import LLMEngine, SamplingParams
from ignis.engine.ngram import NgramIndex
from ignis.engine.speculation import NgramDrafter
from ignis.model import LoadedModel

SPEC = {"speculative": "ngram", "num_speculative_tokens": 6}


def make(loaded: LoadedModel, **over) -> LLMEngine:
    cfg = {"max_num_seqs": 8, "num_kv_blocks": 256, "speculative": "none", **over}  # plain unless asked
    return LLMEngine(loaded, EngineConfig(**cfg))


def repetitive(loaded: LoadedModel, copies: int = 3) -> list[int]:
    """A prompt that repeats a sentence: its continuation is likely to copy it."""
    text = "The quick brown fox jumps over the lazy dog near the river bank. "
    return loaded.tokenizer.encode(text * copies)


# -- the index ----------------------------------------------------------------------------


def test_index_proposes_what_followed_the_longest_latest_match() -> None:
    index = NgramIndex(max_n=3, min_n=1)
    #        0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]
    # "1 2 3" last seen ending at 6 (then 7); before that at 2 (then 9): the latest wins
    assert index.propose(tokens, 3) == [7, 1, 2]
    assert index.propose([5, 6, 7], 4) == []  # nothing repeats
    assert NgramIndex(max_n=2, min_n=2).propose([4, 8, 4], 2) == []  # "8 4" never before; 1-grams off
    assert NgramIndex(max_n=2, min_n=1).propose([4, 8, 4], 2) == [8, 4]


def test_index_fed_incrementally_equals_one_built_at_once() -> None:
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5] * 2
    grown = NgramIndex(4, 1)
    for end in range(1, len(tokens) + 1):
        fresh = NgramIndex(4, 1)
        assert grown.propose(tokens[:end], 5, follow=False) == fresh.propose(tokens[:end], 5), end


def test_index_follows_the_source_a_copy_is_going_on_from() -> None:
    """A rewrite copying lines 0-11 in order: after "1 2 3 4", the latest occurrence of
    "1 2 3 4" is the later line (then 8), but the copy was going on from the first (then 5)."""
    #             0  1  2  3  4  5  6  7  8  9 10 11
    source = [0, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 8]
    out = [0, 1, 2, 3]  # the copy so far
    index = NgramIndex(max_n=4, min_n=2)
    assert index.propose(source + out[:2], 2) == [2, 3]  # "0 1" last seen at the start: copy from 2
    assert NgramIndex(4, 2).propose(source + out + [4], 3) == [8, 0, 1]  # no history: the latest "1 2 3 4"
    assert index.propose(source + out + [4], 3) == [5, 6, 1]  # followed the copy: its next tokens
    assert index.propose(source + out + [4], 3, follow=False) == [8, 0, 1]
    assert index.propose(source + out + [4, 9], 3) == []  # it went elsewhere: lookups again ("4 9" unseen)


def test_drafter_refuses_rows_whose_sampling_reads_the_output(tiny: LoadedModel) -> None:
    engine = make(tiny, **SPEC)
    prompt = repetitive(tiny)
    engine.add_request("plain", prompt, SamplingParams.greedy(8))
    engine.add_request("pen", prompt, SamplingParams.greedy(8, repetition_penalty=1.3))
    engine.add_request("min", prompt, SamplingParams.greedy(8, min_tokens=4))
    seqs = engine.seqs
    assert NgramDrafter.eligible(seqs["plain"]) and not NgramDrafter.eligible(seqs["pen"])
    assert not NgramDrafter.eligible(seqs["min"])  # 0 of its 4 tokens yet
    drafter = NgramDrafter(4, max_seqs=2)
    assert drafter(seqs["plain"], 100, 3) == []  # more decode rows than max_seqs
    seqs["plain"].max_tokens = 1
    assert drafter(seqs["plain"], 100, 1) == []  # the step's own token reaches max_tokens


def test_a_mixtures_drafts_start_at_one_token_and_grow_by_what_is_kept(tiny: LoadedModel, tmp_path) -> None:
    from ignis.engine.speculation import MIXTURE_MAX_BACKOFF
    from ignis.model import load_model
    from tests.model.tiny_models import build_tiny_model

    moe = load_model(str(build_tiny_model(tmp_path / "moe", "qwen3_moe", num_layers=1, num_heads=4, num_kv_heads=2,
                                          num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
                     progress=False)
    assert make(moe, **SPEC).drafter.first_tokens == 1 and make(tiny, **SPEC).drafter.first_tokens == 6

    engine = make(tiny, **SPEC)
    engine.add_request("a", repetitive(tiny, 4), SamplingParams.greedy(30))
    seq = engine.seqs["a"]
    drafter = NgramDrafter.for_mixture(6)
    assert len(drafter(seq, 100, 1)) == 1  # a dense model's drafter proposes 6 here
    assert len(NgramDrafter(6)(seq, 100, 1)) == 6
    drafter.observe(seq, 1, 1)
    assert len(drafter(seq, 100, 1)) == 2
    for _ in range(8):  # drafts that keep nothing: waits double up to the mixture's cap
        drafter.observe(seq, 1, 0)
    assert seq.draft_wait == MIXTURE_MAX_BACKOFF


def test_a_draft_that_follows_its_copy_is_whole(tiny: LoadedModel) -> None:
    """Once the tokens have followed the last draft's source, the next draft is num_tokens
    long whatever the last one kept (a mixture's keeps its kept rule); tokens that leave the
    copy go back to lookups."""
    engine = make(tiny, **SPEC)
    engine.add_request("a", repetitive(tiny, 4), SamplingParams.greedy(30))
    seq = engine.seqs["a"]
    drafter = NgramDrafter(6)
    draft = drafter(seq, 100, 1)
    assert len(draft) == 6
    drafter.observe(seq, 6, 1)  # kept one: the kept rule says two next
    seq.token_ids += draft[:2]  # the kept token, and a sampled one equal to the draft's next
    assert NgramDrafter.for_mixture(6)(seq, 100, 1) == draft[2:4]
    following = drafter(seq, 100, 1)
    assert len(following) == 6 and following[:4] == draft[2:]
    seq.token_ids.append(-1)  # off the copy (an id found nowhere): no source, no lookup
    assert drafter(seq, 100, 1) == []


# -- exactness ----------------------------------------------------------------------------


def run(loaded: LoadedModel, prompts: list[list[int]], params: list[SamplingParams], **over):
    engine = make(loaded, **over)
    out = engine.generate(prompts, params)
    return out, engine


def test_greedy_is_token_for_token_plain_decoding(tiny: LoadedModel) -> None:
    prompts = [repetitive(tiny, 3), repetitive(tiny, 2)[5:], [5, 6, 7, 8, 5, 6, 7]]
    params = [SamplingParams.greedy(40, ignore_eos=True)] * 3
    plain, _ = run(tiny, prompts, params)
    spec, engine = run(tiny, prompts, params, **SPEC)
    assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
    assert [c.text for c in spec] == [c.text for c in plain]
    assert engine.num_draft_tokens > 0 and 0 < engine.num_accepted_draft_tokens <= engine.num_draft_tokens
    assert engine.num_steps < sum(len(c.token_ids) for c in plain)  # fewer steps than tokens: drafts kept
    # each request's usage carries its own share (the server reports it as prediction tokens)
    assert sum(c.usage.accepted_draft_tokens for c in spec) == engine.num_accepted_draft_tokens
    assert sum(c.usage.draft_tokens for c in spec) == engine.num_draft_tokens
    assert all(c.usage.draft_tokens == 0 for c in plain)


def test_seeded_sampling_is_token_for_token_plain_decoding(tiny: LoadedModel) -> None:
    prompts = [repetitive(tiny)] * 4
    params = [SamplingParams(max_tokens=32, temperature=0.3, top_k=3, seed=s, ignore_eos=True, logprobs=True,
                             top_logprobs=3) for s in range(4)]
    plain, _ = run(tiny, prompts, params)
    spec, engine = run(tiny, prompts, params, **SPEC)
    assert engine.num_accepted_draft_tokens > 0
    for a, b in zip(spec, plain):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert [[t for t, _ in top] for top in a.top_logprobs] == [[t for t, _ in top] for top in b.top_logprobs]


def test_unseeded_sampling_keeps_the_distribution(tiny: LoadedModel) -> None:
    """Chi-square over the first two tokens' joint outcome, 300 requests each way, each side
    with seeds of its own (two independent samples, reproducible: only the distribution can
    agree)."""
    prompt = repetitive(tiny)
    counts = []
    for base, over in ((1000, {}), (5000, SPEC)):
        params = [SamplingParams(max_tokens=8, temperature=1.5, ignore_eos=True, seed=base + i) for i in range(300)]
        out, engine = run(tiny, [prompt] * 300, params, max_num_seqs=300, num_kv_blocks=2048,
                          **({**over, "speculative_max_seqs": 300} if over else {}))
        counts.append(Counter(tuple(c.token_ids[:2]) for c in out))
        if over:
            assert engine.num_draft_tokens > 0
    keys = [k for k in set(counts[0]) | set(counts[1]) if counts[0][k] + counts[1][k] >= 10]
    rest = [k for k in set(counts[0]) | set(counts[1]) if k not in keys]
    cells = [(counts[0][k], counts[1][k]) for k in keys] + [(sum(counts[0][k] for k in rest),
                                                               sum(counts[1][k] for k in rest))]
    cells = [c for c in cells if sum(c) > 0]
    chi2 = sum((a - b) ** 2 / (a + b) for a, b in cells)  # two equal-size samples
    dof = len(cells) - 1
    # p < 0.001 would fail: the chi-square's 99.9% point, by the Wilson-Hilferty form
    z = 3.09
    limit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3 if dof else 0.0
    assert chi2 <= limit, (chi2, dof, cells)


def test_stop_strings_and_max_tokens_end_where_plain_decoding_ends(tiny: LoadedModel) -> None:
    prompt = repetitive(tiny)
    first, _ = run(tiny, [prompt], [SamplingParams.greedy(30, ignore_eos=True)])
    text = first[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cases = [SamplingParams.greedy(30, ignore_eos=True, stop=[stop]), SamplingParams.greedy(7, ignore_eos=True),
             SamplingParams.greedy(1, ignore_eos=True)]
    for p in cases:
        plain, _ = run(tiny, [prompt], [p])
        spec, _ = run(tiny, [prompt], [p], **SPEC)
        assert (spec[0].token_ids, spec[0].text, spec[0].finish_reason) == (
            plain[0].token_ids, plain[0].text, plain[0].finish_reason)
        assert len(spec[0].token_ids) <= (p.max_tokens or 0)


def test_prefix_cache_and_preemption_keep_the_output(tiny: LoadedModel) -> None:
    prompts = [repetitive(tiny, 4)[k:] for k in range(6)]
    params = [SamplingParams.greedy(48, ignore_eos=True)] * 6
    plain, _ = run(tiny, prompts, params)
    # a pool too small for six sequences at once: preemptions, recomputes from the cache
    spec, engine = run(tiny, prompts, params, num_kv_blocks=40, speculative_max_seqs=8, **SPEC)
    assert engine.scheduler.num_preemptions > 0 and engine.num_accepted_draft_tokens > 0
    assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
    again = engine.generate(prompts[:1], params[:1])[0]  # the prompt now in the prefix cache
    assert again.token_ids == plain[0].token_ids


# Any text without a digit (the repetition goes through), lower-case words only (it refuses
# the prompt's capitals and full stop: drafts are cut there), and the prompt's sentence
# alone (each position's mask its own: a draft position masked as another would not match).
GRAMMARS = [r"[^0-9]{0,400}", r"([a-z]+ ){1,80}[a-z]+",
            r"(The quick brown fox jumps over the lazy dog near the river bank\. ){1,4}"]
# A rule bounded by max_tokens (as the server's tool and thinking grammars are): llguidance
# cannot roll such a matcher back, so draft masks come from a copy.
BOUNDED = 'start: text\ntext[max_tokens=30]: /[^0-9]*/'


def _grammar(pattern: str):
    from ignis.engine.grammar import Grammar

    return Grammar.lark(pattern) if pattern == BOUNDED else Grammar.regex(pattern)


@pytest.mark.parametrize("pattern", [*GRAMMARS, BOUNDED])
def test_grammar_rows_draft_and_keep_plain_decodings_output(tiny: LoadedModel, pattern: str) -> None:

    # (the random model copies little: the last prompt is one it loops on)
    prompts = [repetitive(tiny, 3), repetitive(tiny, 2)[3:], [5, 6, 7, 8, 5, 6, 7]]
    grammar = _grammar(pattern)
    kept = 0
    for params in ([SamplingParams.greedy(40, grammar=grammar)] * 3,
                   [SamplingParams(max_tokens=40, temperature=0.7, seed=s, grammar=grammar, logprobs=True)
                    for s in (1, 2, 3)]):
        plain, _ = run(tiny, prompts, params)
        spec, engine = run(tiny, prompts, params, **SPEC)
        assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
        assert [c.finish_reason for c in spec] == [c.finish_reason for c in plain]
        for a, b in zip(spec, plain, strict=True):  # logprobs as if sampled one by one
            assert (a.logprobs is None) == (b.logprobs is None)
            assert a.logprobs is None or a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert engine.num_draft_tokens > 0
        kept += engine.num_accepted_draft_tokens
        assert pattern == BOUNDED or all(re.fullmatch(pattern, c.text) for c in spec if c.finish_reason == "stop")
        assert all(c.error is None for c in spec)
    assert kept > 0  # a kept draft token: the positions after it sampled under the draft's masks


def test_a_draft_ends_at_the_grammars_first_refusal(tiny: LoadedModel) -> None:
    import numpy as np

    from ignis.engine.grammar import Grammar, GrammarState, fill_draft_masks, ll_tokenizer

    tok = tiny.tokenizer
    ll = ll_tokenizer(tok, tiny.model.config.vocab_size)
    text = tok.encode("the quick brown fox")
    state = GrammarState(Grammar.regex("the quick brown( fox)?"), ll)
    draft = text + tok.encode(" jumps")
    cut = state.valid_prefix(draft)
    assert 0 < cut < len(draft) and draft[:cut] == text[:cut]
    out = np.zeros((len(draft), state.mask_words), dtype=np.int32)
    before = np.zeros((1, state.mask_words), dtype=np.int32)
    state.matcher.unsafe_compute_mask_ptr(before.ctypes.data, before.shape[1] * 4)
    fill_draft_masks(state, draft, out)
    for j in range(cut):  # each: a fresh matcher's mask after the draft's first j + 1 tokens
        fresh = GrammarState(state.grammar, ll)
        assert fresh.matcher.consume_tokens(draft[: j + 1])
        want = np.zeros((1, state.mask_words), dtype=np.int32)
        fresh.matcher.unsafe_compute_mask_ptr(want.ctypes.data, want.shape[1] * 4)
        assert np.array_equal(out[j], want[0]), j
    assert not out[cut:].any()  # past the refusal: nothing filled
    after = np.zeros_like(before)  # and the matcher is where it began
    state.matcher.unsafe_compute_mask_ptr(after.ctypes.data, after.shape[1] * 4)
    assert np.array_equal(after, before) and state.valid_prefix(draft) == cut
    engine = make(tiny, **SPEC)
    engine.add_request("g", repetitive(tiny), SamplingParams.greedy(8, grammar=Grammar.regex("(ab )+")))
    seq = engine.seqs["g"]
    assert not NgramDrafter.eligible(seq)  # a grammar drafts once its masks have shown they are quick
    seq.grammar.quick = True
    assert NgramDrafter.eligible(seq)
    drafter = NgramDrafter(6)
    grammar, seq.grammar = seq.grammar, None
    assert drafter(seq, 100, 1)  # the prompt's repetition proposes a draft ...
    seq.grammar, seq.ngram = grammar, None
    assert drafter(seq, 100, 1) == []  # ... which "(ab )+" refuses from its first token
    seq.grammar.late = True
    assert not NgramDrafter.eligible(seq)


def test_slow_draft_masks_defer_the_row_and_keep_the_output(tiny: LoadedModel,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft's masks that miss the step defer its row (nothing sampled, nothing consumed,
    the sequence waits for them); it then stops drafting, and the output is unchanged."""
    import time

    import ignis.engine.grammar_masks as masks_module
    from ignis.engine.grammar import Grammar

    real, slow = masks_module.fill_draft_masks, []

    def fill(state, draft, out):
        slow.append(len(draft))
        time.sleep(0.2)
        real(state, draft, out)

    prompts = [repetitive(tiny, 3)]
    params = [SamplingParams.greedy(30, grammar=Grammar.regex(GRAMMARS[2]))]
    plain, _ = run(tiny, prompts, params)
    monkeypatch.setattr(masks_module, "fill_draft_masks", fill)
    spec, engine = run(tiny, prompts, params, **SPEC)
    assert slow and spec[0].token_ids == plain[0].token_ids and spec[0].finish_reason == plain[0].finish_reason
    assert len(slow) < 3  # slow draft masks: the grammar drafts no more (it is not quick)


def test_native_decode_op_checks_drafts_exactly(smollm2_quantized: LoadedModel) -> None:
    """The embedded model at `quantized`: drafts go through the native decode op as one-token
    rows (each its own length) and the output is plain decoding's."""
    loaded = smollm2_quantized
    prompt = repetitive(loaded, 4)
    params = [SamplingParams.greedy(32, ignore_eos=True)]
    plain, e0 = run(loaded, [prompt], params, max_num_seqs=1)
    spec, engine = run(loaded, [prompt], params, max_num_seqs=1, **SPEC)
    if e0.runner.native is None:
        pytest.skip("the native decode op is not built here")
    assert spec[0].token_ids == plain[0].token_ids
    assert engine.num_accepted_draft_tokens > 0
    from ignis.engine.grammar import Grammar  # and under an output grammar

    params = [SamplingParams.greedy(32, grammar=Grammar.regex(GRAMMARS[0]))]
    plain, _ = run(loaded, [prompt], params, max_num_seqs=1)
    spec, engine = run(loaded, [prompt], params, max_num_seqs=1, **SPEC)
    assert spec[0].token_ids == plain[0].token_ids
    assert engine.num_accepted_draft_tokens > 0


@pytest.fixture(scope="module")
def smollm2_quantized() -> LoadedModel:
    from ignis.model import load_model

    return load_model(progress=False, weight_form="quantized", max_num_seqs=1)


def test_drafts_share_the_rows_a_step_computes_exactly() -> None:
    """max_draft_step_rows bounds a step's decode rows, drafts included (on AVX2 CPUs the
    Q4_K / Q6_K GEMMs take 8-bit activations from 16 rows): the draft room goes round the
    decode rows, and a row that drafts less leaves its share to the rows after it."""
    from ignis.engine.block_manager import BlockManager
    from ignis.engine.scheduler import Scheduler
    from ignis.engine.sequence import Sequence

    asked: list[int] = []

    def drafter(seq: Sequence, room: int, decode_rows: int) -> list[int]:
        asked.append(room)
        return [5] * min(room, 1 if seq.request_id == "s1" else 8)

    def schedule(limit: int | None, n: int) -> list[int]:
        sch = Scheduler(BlockManager(256, 16), max_num_seqs=8, max_num_batched_tokens=512,
                        drafter=drafter, max_draft_step_rows=limit)
        for i in range(n):
            s = Sequence(f"s{i}", list(range(20)), SamplingParams.greedy(64), seed=0, max_tokens=64, text=None)
            sch.add(s)
        batch = sch.schedule()  # the prompts' prefill
        for s, k in zip(batch.seqs, batch.num_new_tokens):
            s.num_computed_tokens += k
            s.token_ids.append(7)
        asked.clear()
        return sch.schedule().num_new_tokens

    assert schedule(None, 4) == [9, 2, 9, 9]  # no bound: each row as long as its drafter goes
    rows = schedule(15, 4)
    assert sum(rows) == 15 and asked == [2, 3, 4, 4] and rows == [3, 2, 5, 5]
    assert schedule(15, 1) == [9] and schedule(3, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError):
        Scheduler(BlockManager(8, 16), max_num_seqs=1, max_num_batched_tokens=8, max_draft_step_rows=0)


def test_checks_stay_within_the_rows_the_native_gemms_compute_exactly(tmp_path) -> None:
    """Four sequences drafting at once on a Q4_K_M file (experiments/synthetic_gguf.py, a tiny
    shape) on a CPU whose Q4_K / Q6_K GEMMs have a many-row body: every step with drafts
    holds fewer rows than that body takes, and the output is plain decoding's token for token."""
    from experiments.synthetic_gguf import Shape, write
    from ignis.model import load_model
    from ignis.model.layers import exact_step_rows
    from ignis.model.packed import WIDEN_ROWS
    from ignis_kernels import cpu_native

    many = cpu_native.many_rows()
    if many == 0:
        pytest.skip("no many-row GEMM body on this CPU")
    shape = Shape("llama", 256, 2, 4, 2, 64, 512, 49152 + 40, True, 500000.0)
    loaded = load_model(str(write(shape, "q4_k_m", tmp_path / "q4_k_m.gguf", progress=False)),
                        progress=False, weight_form="quantized", max_num_seqs=4)
    assert exact_step_rows(loaded.model) == min(many, WIDEN_ROWS) - 1
    prompts = [[(7 * i + j) % 50 + 300 for j in range(12)] * 4 for i in range(4)]  # each repeats itself
    params = [SamplingParams.greedy(16, ignore_eos=True)] * 4
    plain, _ = run(loaded, prompts, params, max_num_seqs=4)
    engine = make(loaded, max_num_seqs=4, speculative="ngram", num_speculative_tokens=8)
    steps: list[int] = []
    schedule = engine.scheduler.schedule

    def recorded():
        batch = schedule()
        if any(batch.drafts):
            steps.append(sum(batch.num_new_tokens))
        return batch

    engine.scheduler.schedule = recorded
    spec = engine.generate(prompts, params)
    assert steps and max(steps) <= many - 1 and engine.num_draft_tokens > 0
    assert engine.scheduler.max_draft_step_rows == many - 1
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
