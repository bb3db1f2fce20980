"""Thinking budgets (ignis/engine/thinking.py): the state on its own, then through the
engine with the tiny model biased to think forever: the closing tag is forced after the
budget (opened by the model or by the prompt, budget 0 included), other rows of the
batch are untouched, preemption keeps the count, logprobs come from the masked
distribution, and the row-by-row retry masks afresh. Then the same budget carried by an
output grammar (a ``max_tokens`` on its think rule), as the server builds it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from ignis.config import EngineConfig
from ignis.engine import LLMEngine, SamplingParams
from ignis.engine.grammar import Grammar
from ignis.engine.sequence import Sequence
from ignis.engine.thinking import BudgetState, ThinkBudget
from ignis.model import LoadedModel

CFG = EngineConfig(num_kv_blocks=64, block_size=4, cpu_pack_weights=False)
PROMPT = [298, 330, 326, 293, 323]  # "The cap ital of Fr" in the tiny vocabulary
THINK, END, A = 7, 8, 9  # stand-ins for <think>, </think> and a word


# -- the state -----------------------------------------------------------------------


def test_budget_in_a_block_the_prompt_opened() -> None:
    state = BudgetState(ThinkBudget(2, END, THINK, starts_open=True))
    for _ in range(2):
        assert state.forced() is None
        state.advance(A)
    assert state.forced() == END
    state.advance(END)
    assert state.done and state.forced() is None


def test_the_model_closes_the_block_within_its_budget() -> None:
    state = BudgetState(ThinkBudget(2, END, THINK, starts_open=True))
    state.advance(A)
    state.advance(END)
    assert state.done


def test_only_the_first_token_may_open_a_block() -> None:
    state = BudgetState(ThinkBudget(1, END, THINK))
    assert state.forced() is None
    state.advance(A)  # the answer began without a block: nothing more to do
    assert state.done and state.forced() is None
    state = BudgetState(ThinkBudget(1, END, THINK))
    state.advance(THINK)  # the opening tag is not counted
    assert state.forced() is None
    state.advance(A)
    assert state.forced() == END
    # Budget 0: the closing tag right after the opening one.
    state = BudgetState(ThinkBudget(0, END, THINK))
    state.advance(THINK)
    assert state.forced() == END


def test_an_opening_of_several_tokens() -> None:
    """harmony's analysis message opens with <|channel|>analysis<|message|>: the block opens
    only when the output begins with all three, and none of them is counted."""
    CH, WORD = 11, 12
    state = BudgetState(ThinkBudget(2, END, THINK, header=(CH, WORD)))
    for token in (CH, WORD, THINK):
        assert state.forced() is None and not state.inside
        state.advance(token)
    assert state.inside and state.used == 0
    state.advance(A)
    state.advance(A)
    assert state.forced() == END
    for start in ([CH, A], [WORD], [THINK]):  # another header (final), or the opening out of order
        state = BudgetState(ThinkBudget(2, END, THINK, header=(CH, WORD)))
        for token in start:
            state.advance(token)
        assert state.done and state.forced() is None
        state.advance(THINK)  # nothing reopens a block once the answer began without one
        assert state.done and not state.inside
    with pytest.raises(ValueError, match="header"):
        ThinkBudget(2, END, THINK, header=(-1,)).validate()
    assert BudgetState(ThinkBudget(0, END, None, starts_open=True)).forced() == END


def test_validation() -> None:
    for bad in [ThinkBudget(-1, END), ThinkBudget(True, END), ThinkBudget(3, -1), ThinkBudget(3, END, -2),  # type: ignore[arg-type]
                ThinkBudget(3, "x")]:  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            SamplingParams(think_budget=bad).validate()
    with pytest.raises(ValueError, match="past|in \\[0"):
        ThinkBudget(3, 10**6).validate(vocab_size=1000)
    with pytest.raises(ValueError, match="grammar"):
        SamplingParams(think_budget=ThinkBudget(3, END), grammar=Grammar.regex("a")).validate()


# -- through the engine ----------------------------------------------------------------


def biased(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch, bias: Callable[[Sequence], dict[int, float]]) -> None:
    """Make the random model 'want' tokens: add bias(seq) to its logits before sampling."""
    real = engine.runner.sampler._sample_rows

    def sample_rows(logits: torch.Tensor, rows: list[Sequence], *rest: object) -> object:
        logits = logits.clone()
        for k, seq in enumerate(rows):
            for t, v in bias(seq).items():
                logits[k, t] += v
        return real(logits, rows, *rest)

    monkeypatch.setattr(engine.runner.sampler, "_sample_rows", sample_rows)


def tags(tiny: LoadedModel) -> tuple[int, int, int]:
    tok = tiny.tokenizer
    return tok.added_tokens["<think>"], tok.added_tokens["</think>"], tok.token_to_id("Paris")


def test_budget_closes_the_block(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    think, end, paris = tags(tiny)
    # A model that opens a think block and never closes it.
    wants = lambda seq: {think: 1e4} if seq.num_output_tokens == 0 else {paris: 1e4}  # noqa: E731
    for budget, opened_by in [(3, "model"), (0, "model"), (2, "prompt")]:
        engine = LLMEngine(tiny, CFG)
        biased(engine, monkeypatch, wants if opened_by == "model" else (lambda seq: {paris: 1e4}))
        b = ThinkBudget(budget, end, think, starts_open=opened_by == "prompt")
        out = engine.generate([PROMPT], SamplingParams(max_tokens=12, temperature=1.0, seed=3, ignore_eos=True,
                                                       think_budget=b))[0]
        head = [think] if opened_by == "model" else []
        assert out.token_ids[: len(head) + budget + 1] == head + [paris] * budget + [end]
        assert out.token_ids[len(head) + budget + 1 :] == [paris] * (12 - len(head) - budget - 1)  # free after


@pytest.mark.parametrize("sampled", [False, True])
def test_a_forced_row_leaves_the_others_alone(tiny: LoadedModel, sampled: bool) -> None:
    think, end, _ = tags(tiny)
    prompts = [[5, 6, 7, 8], list(range(10, 31)), PROMPT, [9, 3]]
    for seed in (range(4) if sampled else [None]):
        def params(k: int, budget: ThinkBudget | None = None) -> SamplingParams:
            if sampled:
                return SamplingParams(max_tokens=10, temperature=1.0, seed=seed * 10 + k, ignore_eos=True,
                                      think_budget=budget)
            return SamplingParams.greedy(10, ignore_eos=True, think_budget=budget)

        alone = [LLMEngine(tiny, CFG).generate([p], params(k))[0].token_ids for k, p in enumerate(prompts)]
        mixed = [params(k, ThinkBudget(1, end, think, starts_open=True) if k == 2 else None) for k in range(4)]
        outs = LLMEngine(tiny, CFG).generate(prompts, mixed)
        for k in (0, 1, 3):
            assert outs[k].token_ids == alone[k]
        assert end in outs[2].token_ids[:2]


def test_preemption_keeps_the_count(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sequences preempted inside their think block (their KV recomputed) still close it
    after exactly the budget."""
    think, end, paris = tags(tiny)
    cfg = EngineConfig(num_kv_blocks=10, block_size=4, cpu_pack_weights=False, max_num_seqs=4)
    prompts = [list(range(10, 18)), list(range(20, 28)), list(range(30, 38))]
    engine = LLMEngine(tiny, cfg)
    biased(engine, monkeypatch, lambda seq: {paris: 1e4})
    b = ThinkBudget(6, end, think, starts_open=True)
    outs = engine.generate(prompts, [SamplingParams.greedy(12, ignore_eos=True, think_budget=b)] * 3)
    assert engine.scheduler.num_preemptions > 0
    for out in outs:
        assert out.token_ids[:7] == [paris] * 6 + [end]


def test_logprobs_of_a_forced_token(tiny: LoadedModel) -> None:
    think, end, _ = tags(tiny)
    b = ThinkBudget(0, end, think, starts_open=True)
    out = LLMEngine(tiny, CFG).generate([PROMPT], SamplingParams.greedy(3, ignore_eos=True, top_logprobs=5,
                                                                        think_budget=b))[0]
    # The forced closing tag is the one possible token: logprob 0, no other alternative.
    assert out.token_ids[0] == end and out.logprobs[0] == 0.0 and out.top_logprobs[0] == [(end, 0.0)]


def test_row_by_row_retry_masks_the_original_logits(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed batched sampler call is retried row by row on the same logits: the forced
    row is masked afresh (its mask went on a copy), the free row is untouched."""
    from ignis.engine import sampler

    think, end, _ = tags(tiny)
    real = sampler.sample
    failed = []

    def flaky(logits: torch.Tensor, params: object, **kw: object) -> object:
        if logits.shape[0] > 1:
            failed.append(True)
            raise RuntimeError("batched call failed")
        return real(logits, params, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(sampler, "sample", flaky)
    b = ThinkBudget(2, end, think, starts_open=True)
    params = [SamplingParams(max_tokens=8, temperature=1.0, seed=3, ignore_eos=True, think_budget=b),
              SamplingParams(max_tokens=8, temperature=1.0, seed=4, ignore_eos=True)]
    done = LLMEngine(tiny, CFG).generate([PROMPT, [5, 6, 7]], params)
    assert failed
    assert end in done[0].token_ids[:3]
    monkeypatch.setattr(sampler, "sample", real)
    assert done[1].token_ids == LLMEngine(tiny, CFG).generate([[5, 6, 7]], params[1])[0].token_ids


def test_a_grammar_carries_its_own_budget(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's form with a grammar: a max_tokens on the think rule. After the budget
    only the closing tag is allowed; the answer follows under the grammar."""
    think, end, paris = tags(tiny)
    grammar = Grammar.lark(f'start: (<[{think}]> think <[{end}]>)? ANSWER\nthink[max_tokens=4]: /(.|\\n)*/\n'
                           'ANSWER: /[0-9]+/')
    engine = LLMEngine(tiny, CFG)
    wants = lambda seq: {think: 1e4} if seq.num_output_tokens == 0 else {paris: 1e4}  # noqa: E731
    biased(engine, monkeypatch, wants)
    out = engine.generate([PROMPT], SamplingParams.greedy(12, grammar=grammar))[0]
    assert out.token_ids[:6] == [think] + [paris] * 4 + [end]
    assert tiny.tokenizer.decode(out.token_ids[6:]).strip("0123456789") == ""


def test_sampler_kernel_draws_only_allowed_tokens_of_masked_rows() -> None:
    """Masked rows are mostly -inf: the Triton kernel (interpreted here) draws what the
    reference draws, always an allowed token, with the same logprobs."""
    from ignis_kernels.sampling import SamplingTensors, sample

    B, V = 6, 96
    g = torch.Generator().manual_seed(0)
    allowed = torch.zeros(B, V, dtype=torch.bool)
    for b, n in enumerate([1, 2, 3, 5, 40, 96]):
        allowed[b, torch.randperm(V, generator=g)[:n]] = True
    x = torch.where(allowed, torch.randn(B, V, generator=g) * 3, float("-inf"))
    params = SamplingTensors.from_lists(
        [0.0, 1.0, 0.7, 1.3, 1.0, 0.5], top_k=[0, 5, 2, 0, 3, 0], top_p=[1.0, 0.9, 1.0, 0.5, 1.0, 0.8],
        min_p=[0.0, 0.0, 0.1, 0.0, 0.05, 0.0], presence_penalty=[0.0, 0.5, 0.0, 0.0, 0.0, 0.0],
        seed=list(range(B)), step=[3] * B, output_tokens=torch.tensor([[1, 2, -1]] * B, dtype=torch.int32),
        prompt_tokens=torch.full((B, 1), -1, dtype=torch.int32))
    ref, ref_lp = sample(x, params, return_logprobs=True, backend="torch")
    got, got_lp = sample(x, params, return_logprobs=True, backend="triton")
    assert got.tolist() == ref.tolist() and bool(allowed.gather(1, got[:, None]).all())
    assert torch.allclose(got_lp, ref_lp, atol=1e-5) and bool(torch.isfinite(got_lp).all())
