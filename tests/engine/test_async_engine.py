"""The asyncio front on a tiny random Llama: random submits, aborts and deadlines; error
isolation; capacity (room now / FIFO wait); prewarm; shutdown."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from ignis.config import EngineConfig
from ignis.engine import AsyncEngine, EngineDeadError, EngineFinish, SamplingParams
from ignis.model import LoadedModel

END_REASONS = set(EngineFinish)


def make(tiny: LoadedModel, **overrides) -> AsyncEngine:
    cfg = {"num_kv_blocks": 48, "block_size": 4, "max_num_seqs": 8, "max_num_batched_tokens": 32, "cpu_pack_weights": False}
    max_in_flight = overrides.pop("max_in_flight", None)
    cfg.update(overrides)
    return AsyncEngine(tiny, EngineConfig(**cfg), max_in_flight=max_in_flight)


async def drain(stream) -> list:
    return [out async for out in stream]


def engine_threads() -> list[threading.Thread]:
    """Engine threads started by this test: session-scoped servers of other test folders
    (tests/conftest.py) keep their own running until the session ends."""
    return [t for t in threading.enumerate() if t.name == "ignis-engine" and t not in _BEFORE]


_BEFORE: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _threads_before():
    _BEFORE.clear()
    _BEFORE.update(threading.enumerate())


def test_random_submits_aborts_and_deadlines(tiny: LoadedModel) -> None:
    """200 requests with random prompts, sampling, prewarms, aborts, deadlines and a few
    invalid ones: each stream ends exactly once, and every block comes back."""
    rng = random.Random(1234)
    vocab = tiny.config.vocab_size
    prefixes = [[rng.randrange(vocab) for _ in range(21)] for _ in range(3)]

    async def one(engine: AsyncEngine, i: int) -> tuple[str, list]:
        await asyncio.sleep(rng.random() * 0.2)
        kind = rng.choices(["plain", "abort", "deadline", "prewarm", "bad"], [50, 20, 15, 10, 5])[0]
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 50))]
        if rng.random() < 0.5:  # shared prefixes: blocks shared, cached, evicted under churn
            prompt = prefixes[rng.randrange(len(prefixes))] + prompt
        params = SamplingParams(
            max_tokens=rng.randint(1, 24),
            temperature=rng.choice([0.0, 0.7, 1.0]),
            top_p=rng.choice([1.0, 0.9]),
            top_k=rng.choice([0, 5]),
            repetition_penalty=rng.choice([1.0, 1.0, 1.2]),
            seed=rng.choice([None, i]),
            stop=[""] if kind == "bad" else rng.choice([(), ("ab",)]),
        )
        stream = engine.submit(
            prompt,
            params,
            request_id=f"r{i}",
            prewarm=kind == "prewarm",
            timeout=rng.random() * 0.05 if kind == "deadline" else None,
        )
        if kind == "abort":
            await asyncio.sleep(rng.random() * 0.05)
            stream.abort()
            stream.abort()  # twice: harmless
        return kind, await drain(stream)

    async def main() -> None:
        engine = make(tiny)
        core = engine.engine
        step = core.step

        def checked_step():  # bookkeeping checked after every step, in the engine thread
            outs = step()
            core.block_manager.check(list(core.seqs.values()))
            return outs

        core.step = checked_step
        initial = engine.stats.num_free_blocks
        results = await asyncio.gather(*(one(engine, i) for i in range(200)))
        for kind, outs in results:
            assert sum(o.finished for o in outs) == 1 and outs[-1].finished
            last = outs[-1]
            assert last.finish_reason in END_REASONS and last.usage is not None
            if kind == "bad":
                assert last.finish_reason is EngineFinish.ERROR and "stop" in last.error
            elif kind == "prewarm":
                assert last.finish_reason in (EngineFinish.PREWARM, EngineFinish.ERROR) or last.usage.output_tokens == 0
            elif kind == "plain":
                assert last.finish_reason in (EngineFinish.STOP, EngineFinish.LENGTH)
            assert last.usage.output_tokens == sum(len(o.token_ids) for o in outs)
        reasons = {outs[-1].finish_reason for _, outs in results}
        assert {EngineFinish.ABORT, EngineFinish.DEADLINE, EngineFinish.ERROR, EngineFinish.PREWARM} <= reasons
        await asyncio.sleep(0.05)
        stats = engine.stats
        assert stats.num_free_blocks == initial == engine.engine.num_blocks
        assert stats.num_running == stats.num_waiting == stats.num_in_flight == 0
        assert stats.prefix_cache_hit_tokens > 0
        assert engine.healthy
        await engine.aclose()
        assert not engine.healthy

    asyncio.run(main())
    assert not engine_threads()


def test_abort_frees_running_and_waiting_requests(tiny: LoadedModel) -> None:
    async def main() -> None:
        engine = make(tiny, max_num_seqs=1)
        long = SamplingParams.greedy(200, ignore_eos=True)
        running = engine.submit([1, 2, 3, 4, 5], long)
        waiting = engine.submit([6, 7, 8], long)
        first = await running.__anext__()  # it is running now
        assert first.token_ids
        engine.abort(waiting.request_id)
        engine.abort(running.request_id)
        outs_w, outs_r = await drain(waiting), await drain(running)
        assert outs_w[-1].finish_reason is EngineFinish.ABORT and outs_w[-1].usage.output_tokens == 0
        assert outs_r[-1].finish_reason is EngineFinish.ABORT
        await asyncio.sleep(0.05)
        assert engine.stats.num_free_blocks == engine.engine.num_blocks
        await engine.aclose()

    asyncio.run(main())


def test_deadline_has_its_own_finish_reason(tiny: LoadedModel) -> None:
    async def main() -> None:
        engine = make(tiny)
        stream = engine.submit([1, 2, 3], SamplingParams.greedy(10_000, ignore_eos=True), deadline=time.monotonic() + 0.05)
        outs = await drain(stream)
        assert outs[-1].finish_reason is EngineFinish.DEADLINE
        await engine.aclose()

    asyncio.run(main())


def test_bad_request_fails_alone(tiny: LoadedModel) -> None:
    async def main() -> None:
        engine = make(tiny)
        good = engine.submit([1, 2, 3], SamplingParams.greedy(5, ignore_eos=True))
        bad_stop = engine.submit([1, 2, 3], SamplingParams(stop=[""]))
        too_long = engine.submit(list(range(1, 300)), SamplingParams.greedy(5))
        bad_ids = engine.submit([tiny.config.vocab_size + 5], SamplingParams.greedy(5))
        for s in (bad_stop, too_long, bad_ids):
            [out] = await drain(s)
            assert out.finish_reason is EngineFinish.ERROR and out.error
        outs = await drain(good)
        assert outs[-1].finish_reason is EngineFinish.LENGTH and outs[-1].usage.output_tokens == 5
        await engine.aclose()

    asyncio.run(main())


def test_forward_failure_fails_that_step_only(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        engine = make(tiny)
        runner = engine.engine.runner
        real = runner.execute
        calls = {"n": 0}

        def flaky(batch):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("boom")
            return real(batch)

        monkeypatch.setattr(runner, "execute", flaky)
        failed = engine.submit([1, 2, 3], SamplingParams.greedy(5))
        outs = await drain(failed)
        assert outs[-1].finish_reason is EngineFinish.ERROR and "boom" in outs[-1].error
        ok = await engine.submit([1, 2, 3], SamplingParams.greedy(5, ignore_eos=True)).collect()
        assert ok.finish_reason is EngineFinish.LENGTH and len(ok.token_ids) == 5
        assert engine.healthy
        await asyncio.sleep(0.05)
        assert engine.stats.num_free_blocks == engine.engine.num_blocks
        await engine.aclose()

    asyncio.run(main())


def test_sampling_failure_of_one_row_fails_that_request(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        engine = make(tiny)
        sampler = engine.engine.runner.sampler
        real = sampler._sample_rows

        def picky(logits, rows, *rest):
            if any(s.seed == 13 for s in rows):
                raise ValueError("bad row")
            return real(logits, rows, *rest)

        monkeypatch.setattr(sampler, "_sample_rows", picky)
        streams = [engine.submit([5, 6, 7], SamplingParams(max_tokens=4, seed=s, ignore_eos=True)) for s in (11, 13, 17)]
        results = [await s.collect() for s in streams]
        assert [r.finish_reason for r in results] == [EngineFinish.LENGTH, EngineFinish.ERROR, EngineFinish.LENGTH]
        assert "bad row" in results[1].error
        await engine.aclose()

    asyncio.run(main())


def test_dead_engine_thread_is_reported(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        engine = make(tiny)
        monkeypatch.setattr(engine.engine, "step", lambda: (_ for _ in ()).throw(RuntimeError("core bug")))
        stream = engine.submit([1, 2, 3], SamplingParams.greedy(5))
        outs = await drain(stream)
        assert outs[-1].finish_reason is EngineFinish.ERROR and "core bug" in outs[-1].error
        await asyncio.sleep(0.05)
        assert not engine.healthy
        with pytest.raises(EngineDeadError):
            engine.submit([1, 2, 3])
        await engine.aclose()

    asyncio.run(main())
    assert not engine_threads()


def test_capacity_room_now_and_fifo_wait(tiny: LoadedModel) -> None:
    async def main() -> None:
        engine = make(tiny, max_in_flight=2)
        # Long enough that neither finishes (freeing room) before "gone" is cancelled, even on
        # a loaded machine.
        slow = SamplingParams.greedy(400, ignore_eos=True)
        a = engine.try_submit([1, 2, 3], slow)
        b = engine.try_submit([4, 5, 6], slow)
        assert a is not None and b is not None
        assert not engine.has_room()
        assert engine.try_submit([7, 8], slow) is None  # HTTP: 503
        order: list[str] = []

        async def queued(name: str) -> None:
            stream = await engine.submit_when_room([9, 10], SamplingParams.greedy(2), request_id=name)
            order.append(name)
            await drain(stream)

        waiters = [asyncio.create_task(queued(f"w{i}")) for i in range(3)]
        await asyncio.sleep(0.01)
        assert engine.stats.num_room_waiters == 3
        cancelled = asyncio.create_task(queued("gone"))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        await drain(a)
        await drain(b)
        await asyncio.gather(*waiters)
        assert order == ["w0", "w1", "w2"]
        assert engine.has_room() and engine.stats.num_in_flight == 0
        await engine.aclose()

    asyncio.run(main())


def test_prewarm_reports_usage_and_warms_the_cache(tiny: LoadedModel) -> None:
    async def main() -> None:
        engine = make(tiny)
        prompt = list(range(10, 40))  # 30 tokens: 7 full blocks of 4
        [pre] = await drain(engine.submit(prompt, prewarm=True))
        assert pre.finish_reason is EngineFinish.PREWARM and pre.token_ids == []
        assert pre.usage.prompt_tokens == 30 and pre.usage.output_tokens == 0
        real = await engine.submit(prompt + [50, 51], SamplingParams.greedy(3)).collect()
        assert real.usage.cached_tokens == 28
        assert engine.stats.prefix_cache_hit_tokens >= 28
        await engine.aclose()

    asyncio.run(main())


def test_streaming_deltas_fold_into_the_text(tiny: LoadedModel) -> None:
    async def main() -> None:
        engine = make(tiny)
        outs = await drain(engine.submit([1, 2, 3, 4], SamplingParams.greedy(20, ignore_eos=True, logprobs=True)))
        ids = [t for o in outs for t in o.token_ids]
        assert len(ids) == 20 and sum(len(o.logprobs) for o in outs) == 20
        assert "".join(o.text for o in outs) == tiny.tokenizer.decode(ids, skip_special_tokens=True)
        assert all(lp <= 0.0 for o in outs for lp in o.logprobs)
        await engine.aclose()

    asyncio.run(main())


def test_shutdown_aborts_open_requests(tiny: LoadedModel) -> None:
    async def main() -> None:
        engine = make(tiny)
        stream = engine.submit([1, 2, 3], SamplingParams.greedy(10_000, ignore_eos=True))
        await stream.__anext__()
        await engine.aclose()
        outs = await drain(stream)
        assert outs[-1].finished and outs[-1].finish_reason is EngineFinish.ABORT
        with pytest.raises(EngineDeadError):
            engine.submit([1])

    asyncio.run(main())
    assert not engine_threads()
