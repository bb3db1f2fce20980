"""Fair prefill (ignis/engine/scheduler.py): a short prompt that arrives during a long
prompt's prefill is prefilled whole in the next step, beside a smaller chunk of the long
one; decode rows are never cut; the time budget sizes steps from measured costs (a fixed
part per step and a part per token), never so small that the fixed part dominates; the
long prompt always moves on."""

from __future__ import annotations

from ignis.config import EngineConfig
from ignis.engine import LLMEngine, SamplingParams
from ignis.engine.block_manager import BlockManager
from ignis.engine.sampling_params import SamplingParams as Params
from ignis.engine.scheduler import MIN_PREFILL_CHUNK, MIN_TIMED_TOKENS, ScheduledBatch, Scheduler
from ignis.engine.sequence import Sequence
from ignis.engine.step_cost import StepCost
from ignis.model import LoadedModel


def seq(rid: str, n: int) -> Sequence:
    return Sequence(rid, list(range(n)), Params(), seed=0, max_tokens=8, text=None)


def advance(batch: ScheduledBatch) -> None:
    """What a step does to the sequences: their tokens computed, one sampled where due."""
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        s.num_computed_tokens += n
        if s.num_computed_tokens == s.num_tokens:
            s.token_ids.append(7)


def test_a_short_prompt_goes_beside_a_running_long_prefill() -> None:
    sch = Scheduler(BlockManager(256, 16), max_num_seqs=8, max_num_batched_tokens=100)
    long = seq("long", 1000)
    sch.add(long)
    advance(sch.schedule())  # the long prompt's first chunk
    short = seq("short", 12)
    sch.add(short)
    batch = sch.schedule()
    assert {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens)} == {"long": 88, "short": 12}
    advance(batch)
    batch = sch.schedule()  # the short one decodes, the long one goes on
    assert {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens)} == {"short": 1, "long": 99}


def test_decode_rows_are_never_cut_and_the_long_prompt_always_moves_on() -> None:
    sch = Scheduler(BlockManager(512, 16), max_num_seqs=64, max_num_batched_tokens=100)
    decoders = [seq(f"d{i}", 4) for i in range(70)]
    for d in decoders[:60]:
        sch.add(d)
    advance(sch.schedule())  # 60 prompts of 4 (the budget fits 25 of them)
    while len(sch.running) < 60 or any(s.num_computed_tokens < s.num_tokens - 1 for s in sch.running):
        advance(sch.schedule())
    long = seq("long", 5000)
    sch.add(long)
    for d in decoders[60:]:
        sch.add(d)
    batch = sch.schedule()
    got = {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens)}
    assert all(got[f"d{i}"] == 1 for i in range(60))  # every decode row
    assert got["long"] == 40  # the rest of the forward's 100 tokens
    advance(batch)
    batch = sch.schedule()
    got = {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens)}
    # Short prompts wait (3 fit the room left): the long prefill still gets its least chunk,
    # and they what the forward holds beyond it.
    assert all(got[f"d{i}"] == 1 for i in range(60))
    assert got["long"] == MIN_PREFILL_CHUNK and got["d60"] == got["d61"] == 4 and len(got) == 63


def test_the_time_budget_sizes_steps_from_measured_costs() -> None:
    sch = Scheduler(BlockManager(1024, 16), max_num_seqs=8, max_num_batched_tokens=2048, step_time_budget=0.5)
    assert sch.token_budget() == MIN_TIMED_TOKENS  # nothing measured yet
    sch.observe(0.30, ScheduledBatch([seq("a", 600)], [256]))
    assert sch.token_budget() == MIN_TIMED_TOKENS  # one size seen, others waiting: no larger try
    assert sch.token_budget(others_wait=False) == 512  # alone: a larger step tells the parts apart
    sch.observe(0.06, ScheduledBatch([seq("b", 40)], [40]))  # too small to say: not a sample
    sch.observe(0.90, ScheduledBatch([seq("a", 2000)], [1024]))
    fixed, per_token, per_depth = sch.cost.fit()
    assert abs(fixed - 0.1) < 1e-9 and abs(per_token - 0.8 / 1024) < 1e-12 and per_depth == 0
    assert abs(sch.token_budget() - (0.5 - 0.1) / per_token) <= 1  # 512 tokens fit half a second
    assert Scheduler(BlockManager(64, 16), max_num_seqs=8, max_num_batched_tokens=100).token_budget() == 100


def test_steps_stay_large_where_their_fixed_cost_dominates() -> None:
    """The loaded CPU's case: ~18 s a step whatever its size (every weight widened), 10 ms a
    token: no size meets a quarter of a second, and cutting would only multiply the fixed
    part; steps stay at what keeps it within a quarter."""
    cost = StepCost(256, 2048)
    cost.observe(256, 18 + 256 * 0.01)
    cost.observe(1024, 18 + 1024 * 0.01)
    assert cost.tokens_for(0.25) == 2048
    quick = StepCost(256, 2048)  # an unloaded machine: 0.14 s fixed, 1.2 ms a token
    quick.observe(256, 0.14 + 256 * 0.0012)
    quick.observe(1024, 0.14 + 1024 * 0.0012)
    assert abs(quick.tokens_for(0.25) - 0.14 * 3 / 0.0012) < 2  # the fixed part a quarter of the step
    assert abs(quick.tokens_for(2.0) - (2.0 - 0.14) / 0.0012) < 2
    for _ in range(8):  # later steps all of one size: the last fit stands
        quick.observe(350, 0.14 + 350 * 0.0012)
    assert quick.fit() is not None


def test_deeper_chunks_cost_more_and_steps_shrink() -> None:
    """Attention makes a token deeper in its prompt dearer (the quiet 2-core CPU: 1 ms a token
    plus ~0.5 ms per thousand tokens before it). The fit keeps that apart from a fixed part
    (a fit without it read the growth as ~0.6 s fixed, and sized steps of 1-2.4 s against a
    quarter second), and the steps it sizes shrink with depth."""
    cost = StepCost(64, 2048)
    for n, d in [(256, 0), (1024, 256), (256, 1280), (512, 1536), (800, 2048)]:
        cost.observe(n, n * (0.001 + 0.5e-6 * (d + n / 2)), d)
    fixed, per_token, per_depth = cost.fit()
    assert abs(fixed) < 1e-9 and abs(per_token - 0.001) < 1e-9 and abs(per_depth - 0.5e-6) < 1e-12
    shallow, deep = cost.tokens_for(0.25, 0), cost.tokens_for(0.25, 4000)
    assert deep < shallow <= 250
    assert 0 <= 0.25 - cost.seconds(deep, 4000) < cost.seconds(1, 4000)  # within one token of the budget


def test_the_engine_gives_a_short_prompt_its_first_token_in_the_next_step(tiny: LoadedModel) -> None:
    engine = LLMEngine(tiny, EngineConfig(num_kv_blocks=400, block_size=4, cpu_pack_weights=False,
                                          max_num_batched_tokens=48, step_time_budget_ms=None))
    engine.add_request("long", [5] * 240, SamplingParams.greedy(2))  # 5 steps of prefill
    engine.step()
    engine.add_request("short", tiny.tokenizer.encode("hello world"), SamplingParams.greedy(2))
    first = [o for o in engine.step() if o.request_id == "short"]
    assert first and first[0].token_ids  # its whole prompt, and a token, in one step
    while engine.has_unfinished_requests():
        engine.step()


def test_after_a_chunk_over_budget_the_next_step_is_the_decodes_and_short_prompts_alone() -> None:
    sch = Scheduler(BlockManager(512, 16), max_num_seqs=8, max_num_batched_tokens=512, step_time_budget=0.25)
    long, talker = seq("long", 4000), seq("talker", 8)
    sch.add(talker)
    advance(sch.schedule())  # the talker's prompt: it decodes from here on
    sch.add(long)
    batch = sch.schedule()
    assert {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens)} == {"talker": 1, "long": 256}
    sch.observe(20.0, batch)  # far past the budget (the fixed cost of a step on a loaded CPU)
    advance(batch)
    short = seq("short", 10)
    sch.add(short)
    batch = sch.schedule()
    assert {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens)} == {"talker": 1, "short": 10}
    sch.observe(0.1, batch)
    advance(batch)
    batch = sch.schedule()  # and the long prompt goes on
    got = {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens)}
    assert got["talker"] == got["short"] == 1 and got["long"] >= MIN_TIMED_TOKENS
