"""`/v1/chat/completions`, the whole public surface in one import.

- request side: `protocol.chat_request` (`decode_chat_request`, `ChatRequest`, ...)
- response side: `protocol.chat_response` (`ChatStream`), fed the `protocol.deltas`
  objects the Responses stream takes (`Usage` from `protocol.response`,
  `TokenLogprob` from `protocol.events`)
- the conversation both endpoints share: `protocol.conversation`

Server sketch::

    req = decode_chat_request_bytes(body)            # or Refusal -> status + envelope()
    msgs = to_template_messages(req.messages)        # render, tokenize once
    enc = ChatStream(model=req.model, include_usage=req.include_usage,
                     logprobs=req.logprobs, emit=req.stream)
    for delta in engine_deltas:                      # protocol.deltas: TextDelta, ...
        for chunk in enc.feed(delta):
            write(f"data: {json.dumps(chunk)}\\n\\n")
    write("data: [DONE]\\n\\n")                       # streaming
    # or, not streaming: send enc.completion()
"""

from protocol.chat_request import (  # noqa: F401
    TOOL_NAME_PATTERN,
    TOP_LEVEL_KEYS,
    ChatRequest,
    decode_chat_request,
    decode_chat_request_bytes,
    load_json_body,
)
from protocol.chat_response import (  # noqa: F401
    LOGPROB_FLOOR,
    ChatStream,
    StreamStateError,
    build_completion,
    chat_logprob,
    chat_usage,
    completion_id,
)
from protocol.conversation import ChatMessage, FunctionTool, ToolCall, ToolChoice  # noqa: F401
from protocol.deltas import (  # noqa: F401
    Delta,
    Failure,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)
from protocol.events import TokenLogprob  # noqa: F401
from protocol.response import Usage  # noqa: F401

__all__ = [
    "ChatRequest",
    "decode_chat_request",
    "decode_chat_request_bytes",
    "load_json_body",
    "TOP_LEVEL_KEYS",
    "TOOL_NAME_PATTERN",
    "ChatStream",
    "build_completion",
    "completion_id",
    "chat_usage",
    "chat_logprob",
    "StreamStateError",
    "Delta",
    "ReasoningDelta",
    "TextDelta",
    "ToolCallStart",
    "ToolCallArguments",
    "ToolCallEnd",
    "Finish",
    "Failure",
    "TokenLogprob",
    "Usage",
    "LOGPROB_FLOOR",
    "ChatMessage",
    "ToolCall",
    "FunctionTool",
    "ToolChoice",
]
