"""Decode Responses API requests: JSON -> `ResponsesRequest`, or a `Refusal`.

Entry points the server calls (all importable from here):

- `decode_json(raw)`: bytes/str -> a JSON object (dict), or Refusal ``invalid_json``
  (the one JSON loader of every endpoint: it lives in `protocol.checks`).
- `decode_request(body, transport="http" | "socket", ...)`: dict -> `ResponsesRequest`
  (`protocol.decode.request`: the body, one helper per field).
- `decode_input(value)` / `decode_item(obj, param)`: the input items
  (`protocol.decode.items`; `decode_item` is the inverse of ``item.to_dict()``).
- ``tools`` and ``tool_choice``: `protocol.decode.tools`.

The chat-completions body has its own decoder, `protocol.chat_request`; both share
`protocol.checks`, `protocol.sampling` and `protocol.structured`.

Every refusal is OpenAI's envelope with status 400 and ``param`` at the offending
value in OpenAI's notation (``input[3].content[0].text``, ``tools[1].parameters``).

Policy (what is accepted, ignored, refused):

- Accepted and acted on: model, input, instructions, tools (function only),
  tool_choice, parallel_tool_calls, max_output_tokens, temperature, top_p,
  top_logprobs, reasoning (effort -> thinking, see `protocol.sampling`; summary is
  echoed), text (format text, json_schema or json_object: see protocol.structured;
  verbosity echoed), stream, include,
  truncation, and ignis's extensions top_k, min_p, repetition_penalty,
  presence_penalty, frequency_penalty, seed, stop, thinking.
- Accepted, checked, changing nothing: store, metadata, user, prompt_cache_key,
  service_tier, safety_identifier, client_metadata, prompt_cache_retention,
  stream_options (include_obfuscation: ignis sends no obfuscation padding),
  ``background: false``.
- `truncation`: "disabled" (default) and "auto" are both accepted and carried;
  the server decides what "auto" does when the input does not fit (drop the
  oldest items, as OpenAI does, or refuse as "disabled" would).
- `include`: "reasoning.encrypted_content" and "message.output_text.logprobs" act;
  the other values OpenAI knows (file_search_call.results, web_search_call.*,
  message.input_image.image_url, computer_call_output.output.image_url,
  code_interpreter_call.outputs) name outputs of tools ignis refuses, so they
  are accepted and change nothing; anything else is refused (invalid_value).
- Refused (400): unknown fields (``unknown_parameter``); fields OpenAI knows but
  ignis does not implement, when set (``unsupported_parameter``: conversation,
  prompt, max_tool_calls, context_management, moderation, image,
  access_programs, background_options, prompt_cache_options); ``background:
  true``; non-function tools (``tools[i].type``, ``unsupported_value``); a strict
  schema (``text.format`` or a function tool with ``strict: true``) outside OpenAI's
  strict subset (protocol.structured); input items and
  content parts that are not text (``input[i].type``,
  ``input[i].content[j].type``); wrong types, out-of-range values, missing
  required fields (``missing_required_parameter``); ``previous_response_id``
  over HTTP (``previous_response_not_found``; the socket carries it).
- An ``encrypted_content`` that ignis cannot read is dropped, or refused with
  ``strict_encrypted=True`` (see `protocol.decode.items`).
"""

from protocol.checks import decode_json
from protocol.decode.items import decode_input, decode_item
from protocol.decode.request import Transport, decode_request

__all__ = ["decode_json", "decode_request", "decode_input", "decode_item", "Transport"]
