"""A decoded request -> (Prompt, SamplingParams): the transport-neutral start of a turn.

Both endpoints and both transports come through here: the conversation is rendered
(`render`), a JSON format, a demanded tool call or strict and custom tools become the
engine's output grammar (`structured`), a thinking budget goes into that grammar or to
the engine on its own (`tool_forcing`), and the sampling fields, already filled with the served defaults
(`ServerContext.accept`), become `SamplingParams` fitted to the context
(`params`). Rendering and tokenizing are CPU work: callers run this off the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ignis.engine import SamplingParams
from ignis.server.context import ServerContext
from ignis.server.grammar_bounds import check_grammars
from ignis.server.params import check_context, engine_params
from ignis.server.render import Prompt
from ignis.server.structured import output_grammar
from ignis.server.tool_forcing import demand_calls, think_budget
from protocol.chat_request import ChatRequest
from protocol.conversation import FunctionTool, ToolChoice
from protocol.request import ResponsesRequest
from protocol.responses_conversation import to_conversation
from protocol.sampling import EFFORT_THINKING, SamplingFields

__all__ = ["prepare_chat", "prepare_response"]


def prepare_response(ctx: ServerContext, request: ResponsesRequest, *,
                     generation: bool = True) -> tuple[Prompt, SamplingParams | None]:
    """A Responses request whose input is the whole conversation. With `generation` off
    (a socket prewarm) the prompt ends without the generation prompt and there are no
    sampling parameters."""
    conv = to_conversation(request)
    where = {t.name: t.where for t in request.tools}

    def tool_param(name: str) -> str:
        return f"{where.get(name) or 'tools'}.parameters"

    if generation:  # cheap refusals first: nothing is rendered or compiled past a limit
        check_grammars(request.text.format, conv.tools, format_param="text.format", tool_param=tool_param)
    prompt = ctx.renderer.render(
        conv.messages, conv.tools, conv.tool_choice,
        thinking=request.sampling.thinking, generation=generation, param="input",
        max_tokens=ctx.max_model_len - (1 if generation else 0), truncate=request.truncation == "auto",
        effort=request.reasoning.effort if request.reasoning else None, namespaces=dict(request.namespaces),
    )
    if not generation:
        check_context(len(prompt.ids), ctx.max_model_len, "input", prewarm=True)
        return prompt, None
    return _constrained(
        ctx, prompt, conv.tools, conv.tool_choice, request.sampling, request.text.format,
        parallel=request.parallel_tool_calls, logprobs=request.include_logprobs or bool(request.top_logprobs),
        param="input", format_param="text.format", tool_param=tool_param,
    )


def prepare_chat(ctx: ServerContext, request: ChatRequest) -> tuple[Prompt, SamplingParams]:
    """A chat-completions request."""
    index = {t.name: i for i, t in enumerate(request.tools)}

    def tool_param(name: str) -> str:
        return f"tools[{index.get(name, 0)}].function.parameters"

    check_grammars(request.response_format, request.tools, format_param="response_format.json_schema",
                   tool_param=tool_param)
    prompt = ctx.renderer.render(request.messages, request.tools, request.tool_choice,
                                 thinking=request.sampling.thinking, param="messages",
                                 max_tokens=ctx.max_model_len - 1, effort=effort_of(request.sampling))
    return _constrained(
        ctx, prompt, request.tools, request.tool_choice, request.sampling, request.response_format,
        parallel=request.parallel_tool_calls, logprobs=request.logprobs, param="messages",
        format_param="response_format.json_schema", tool_param=tool_param,
    )


def _constrained(ctx: ServerContext, prompt: Prompt, tools: Sequence[FunctionTool], choice: ToolChoice,
                 sampling: SamplingFields, text_format: Any, *, parallel: bool, logprobs: bool, param: str,
                 format_param: str, tool_param: Callable[[str], str]) -> tuple[Prompt, SamplingParams]:
    """The output grammar (with the thinking budget inside it) or the budget alone, and
    the sampling parameters."""
    tokenizer, vocab = ctx.loaded.tokenizer, ctx.loaded.config.vocab_size
    check_context(len(prompt.ids), ctx.max_model_len, param)  # before any grammar compiles
    prompt = demand_calls(prompt, choice, tools)
    budget = think_budget(prompt.parser, tokenizer, sampling.thinking_budget, context=ctx.max_model_len,
                          block=prompt.reasoning_block)
    grammar = None
    if prompt.constrained:  # spelled as the prompt's chat format writes calls (Hermes unless it says)
        grammar = output_grammar(prompt.parser, text_format, tools, choice, sampling, parallel=parallel,
                                 tokenizer=tokenizer, vocab_size=vocab, format_param=format_param,
                                 tool_param=tool_param, think_budget=budget, spelling=prompt.grammar)
    params = engine_params(sampling, prompt_len=len(prompt.ids), max_model_len=ctx.max_model_len,
                           logprobs=logprobs, param=param, think_budget=None if grammar else budget,
                           grammar=grammar)
    if prompt.stop_token_ids:  # the format's own stops (harmony: <|call|>, <|return|>)
        params = replace(params, stop_token_ids=tuple(dict.fromkeys((*params.stop_token_ids, *prompt.stop_token_ids))))
    return prompt, params


def effort_of(sampling: SamplingFields) -> str | None:
    """The ``reasoning_effort`` a chat request's thinking fields were folded from (None: not one of them)."""
    wanted = (sampling.thinking, sampling.thinking_budget)
    return next((effort for effort, pair in EFFORT_THINKING.items() if pair == wanted and effort not in ("max",)), None)
