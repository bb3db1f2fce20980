"""Chat templates: render a conversation with the model's Jinja template, and tokenize it so
that only the template's own markup becomes special tokens.

Rendering follows transformers' `apply_chat_template`: an immutable sandboxed Jinja
environment (trim_blocks, lstrip_blocks, loop controls), a `tojson` that keeps non-ASCII
text, `raise_exception`, `strftime_now`, and the variables messages, tools, documents,
add_generation_prompt, bos_token, eos_token (and enable_thinking when given).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ignis.model.client_text import Neutralizer, plain_data

if TYPE_CHECKING:
    from ignis.model.token_cache import TokenCache, TokenCount
    from ignis.model.tokenizer import Tokenizer


class ChatTemplateError(ValueError):
    """The template failed to render. `raised` is True when the template itself refused the
    conversation through `raise_exception(...)` (the message is then the template's)."""

    def __init__(self, message: str, *, raised: bool = False) -> None:
        super().__init__(message)
        self.raised = raised


# For models that ship no template.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- elif message['content'] is iterable %}"
    "{%- set content = message['content'] | selectattr('text', 'defined') | map(attribute='text') | join('') %}"
    "{%- else %}{%- set content = '' %}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

# Gemma's turn format (what llama.cpp's `--chat-template gemma` renders): the system text
# opens the first user turn, the assistant is "model", each turn ends with <end_of_turn>.
# BOS comes from the template, as in Gemma's own. Tool results come back as user turns
# (Gemma has no tool role).
GEMMA_TEMPLATE = (
    "{{- bos_token if bos_token is defined else '' }}"
    "{%- set ns = namespace(system='') %}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- elif message['content'] is iterable %}"
    "{%- set content = message['content'] | selectattr('text', 'defined') | map(attribute='text') | join('') %}"
    "{%- else %}{%- set content = '' %}{%- endif %}"
    "{%- if message['role'] in ('system', 'developer') %}"
    "{%- set ns.system = ns.system + (content | trim) %}"
    "{%- else %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{- '<start_of_turn>' + role + '\n' }}"
    "{%- if ns.system and role == 'user' %}{{- ns.system + '\n\n' }}{%- set ns.system = '' %}{%- endif %}"
    "{{- (content | trim) + '<end_of_turn>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\n' }}{%- endif %}"
)

# A family's standard template by name (Family.chat_template), for files that ship none.
FAMILY_TEMPLATES = {"chatml": CHATML_TEMPLATE, "gemma": GEMMA_TEMPLATE}

# Family.chat_template names that are chat formats of their own, not Jinja templates
# (ignis/server/chat_formats): the format renders every prompt, whatever template the
# checkpoint ships (gpt-oss's harmony). Every other family's format is "hermes": its Jinja
# template, with Hermes-style tool calls where the template has none.
OWN_FORMATS = frozenset({"harmony"})

# Names a message's reasoning may come under; transformers fills `reasoning_content` and
# `thinking` (gpt-oss) from whichever is present, and so do we.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


# --- the Jinja environment ----------------------------------------------------------------------


class _TemplateRaised(jinja2.TemplateError):
    pass


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; templates expect plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` that refuses underscore names, so a template cannot reach internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # same signature trick as Jinja's
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a template namespace cannot hold {name!r}")


class _Dict:
    """`dict(...)` for templates, without exposing the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict:
        return dict.fromkeys(*args)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in
    transformers; here it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, namespace=_Namespace, dict=_Dict())
    return env


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template syntax error (line {exc.lineno}): {exc.message}") from exc


# --- template data ------------------------------------------------------------------------------


def _prepare_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """As transformers does: drop None-valued keys (templates test presence, not None) and
    expose reasoning under both `reasoning_content` and `thinking`."""
    prepared = []
    for message in plain_data(list(messages)):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"a chat message must be a dict, got {message!r}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


# --- the template -------------------------------------------------------------------------------


# The special tokens a template sees, and the GGUF metadata key of each one's id.
_GGUF_SPECIAL_KEYS = {
    "bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


class ChatTemplate:
    """A model's chat template (its family's standard, `fallback`, when the model has none:
    FAMILY_TEMPLATES; ChatML when the family has none either).

    `source` is the template text, or a mapping of named templates ("default", "tool_use", ...)
    as some models ship; "tool_use" is chosen when tools are given.
    """

    def __init__(
        self,
        source: str | Mapping[str, str] | None,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        fallback: str | None = None,
        **special_tokens: str | None,
    ) -> None:
        #: The chat format prompts are rendered with (ignis/server/chat_formats).
        self.chat_format = fallback if fallback in OWN_FORMATS else "hermes"
        if fallback in OWN_FORMATS:
            fallback = None  # a Jinja stand-in only: ChatML
        self.is_fallback = not source
        self.fallback_name = (fallback or "chatml") if not source else None
        if self.fallback_name is not None and self.fallback_name not in FAMILY_TEMPLATES:
            raise ChatTemplateError(f"no standard chat template {fallback!r} (known: {sorted(FAMILY_TEMPLATES)})")
        templates = {"default": FAMILY_TEMPLATES[self.fallback_name]} if not source else (
            {"default": source} if isinstance(source, str) else dict(source)
        )
        if "default" not in templates:
            raise ChatTemplateError(f"no 'default' among the chat templates {sorted(templates)}")
        self.templates: dict[str, str] = templates
        for text in templates.values():
            _compile(text)  # syntax errors surface now, not on the first request
        tokens = {"bos_token": bos_token, "eos_token": eos_token, **special_tokens}
        # Only tokens that exist: a template testing `bos_token is defined` must see the truth.
        self.special_tokens: dict[str, str] = {k: v for k, v in tokens.items() if v is not None}

    @property
    def source(self) -> str:
        return self.templates["default"]

    @classmethod
    def from_gguf(cls, reader: Any, fallback: str | None = None) -> ChatTemplate:
        """From `tokenizer.chat_template` (and named `tokenizer.chat_template.NAME`) metadata;
        `fallback` names the standard template used when there is none."""
        if isinstance(reader, (str, Path)):
            import gguf

            reader = gguf.GGUFReader(reader)

        def value(key: str) -> Any:
            field = reader.get_field(key)
            return None if field is None else field.contents()

        templates: dict[str, str] = {}
        if default := value("tokenizer.chat_template"):
            templates["default"] = default
        for name in value("tokenizer.chat_templates") or ():
            if text := value(f"tokenizer.chat_template.{name}"):
                templates[name] = text
        tokens = value("tokenizer.ggml.tokens") or []

        def token_at(key: str) -> str | None:
            token_id = value(f"tokenizer.ggml.{key}")
            return tokens[token_id] if isinstance(token_id, int) and 0 <= token_id < len(tokens) else None

        specials = {name: token_at(key) for name, key in _GGUF_SPECIAL_KEYS.items()}
        return cls(templates if "default" in templates else None, fallback=fallback, **specials)

    @classmethod
    def from_hf_dir(cls, path: str | Path, fallback: str | None = None) -> ChatTemplate:
        """From chat_template.jinja (with additional_chat_templates/*.jinja), or else the
        `chat_template` of tokenizer_config.json (a string or a list of named templates)."""
        path = Path(path)
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        templates: dict[str, str] = {}
        raw = config.get("chat_template")
        if isinstance(raw, str):
            templates["default"] = raw
        elif isinstance(raw, list):
            templates.update({entry["name"]: entry["template"] for entry in raw})
        if (path / "chat_template.jinja").is_file():
            templates["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
        if (extra := path / "additional_chat_templates").is_dir():
            templates.update({f.stem: f.read_text(encoding="utf-8") for f in sorted(extra.glob("*.jinja"))})

        def token(key: str) -> str | None:
            value = config.get(key)
            return value.get("content") if isinstance(value, dict) else value if isinstance(value, str) else None

        specials = {name: token(name) for name in _GGUF_SPECIAL_KEYS}
        return cls(templates if "default" in templates else None, fallback=fallback, **specials)

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text. Extra keyword arguments become template variables (documents,
        reasoning_effort...). Raises ChatTemplateError on any template failure."""
        name = "tool_use" if tools is not None and "tool_use" in self.templates else "default"
        template = _compile(self.templates[name])
        variables = {**self.special_tokens, **plain_data(kwargs)}
        if enable_thinking is not None:
            variables["enable_thinking"] = enable_thinking
        variables.setdefault("documents", None)
        variables.update(
            messages=_prepare_messages(messages),
            tools=plain_data(tools),
            add_generation_prompt=add_generation_prompt,
        )
        try:
            return template.render(**variables)
        except _TemplateRaised as exc:
            raise ChatTemplateError(str(exc.message), raised=True) from exc
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc.message or type(exc).__name__}") from exc
        except Exception as exc:  # templates fail with TypeError, KeyError... on unexpected input
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc

    def __repr__(self) -> str:
        kind = f"{self.fallback_name} fallback" if self.is_fallback else f"{len(self.source)} chars"
        return f"ChatTemplate({kind}, named={sorted(self.templates)})"


# --- tokenizing a conversation ------------------------------------------------------------------


class PromptTooLong(ValueError):
    """The rendered text is surely longer than the token limit (checked on characters,
    before tokenizing): `chars` characters."""

    def __init__(self, chars: int) -> None:
        super().__init__(f"the rendered prompt has {chars} characters, more than the token limit can hold")
        self.chars = chars


def _check_length(tokenizer: Any, chars: int, text: str | list[str], max_chars: int | None) -> None:
    """Raise PromptTooLong when `chars` characters cannot fit `max_chars` (see
    `Tokenizer.max_token_bytes`); a normalizing pipeline is measured after normalization,
    and only in that rare over-long case."""
    if max_chars is None or chars <= max_chars:
        return
    measure = getattr(tokenizer, "normalized_length", None)
    if measure is not None:
        chars = measure(text) if isinstance(text, str) else sum(measure(t) for t in text)
        if chars <= max_chars:
            return
    raise PromptTooLong(chars)


def encode_chat(
    tokenizer: Tokenizer,
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    token_cache: TokenCache | None = None,
    token_count: TokenCount | None = None,
    max_chars: int | None = None,
    **kwargs: Any,
) -> list[int]:
    """Render and tokenize a conversation. Special tokens come only from the template's own
    text; text from the client (contents, names, tool arguments, tool schemas, roles, extra
    variables) never becomes a special token, whatever it contains.

    When no client string holds markup (the ordinary case), the rendered text is tokenized in
    one pass with added tokens parsed, exactly as `apply_chat_template(..., tokenize=True)`.
    Otherwise every added-token string in client strings, and every fragment of one at a
    string's edge, is swapped for a random digit placeholder before rendering, so the template
    cannot emit it; the rendered text is cut at the added tokens it then contains (all the
    template's own) and the pieces between are tokenized as plain text once the placeholders
    are turned back into the original strings. Tokenizing pieces separately is also what the
    one-pass tokenizer does around added tokens, so nothing else changes.

    Limits: the template sees placeholders instead of that markup, so template logic that looks
    for markup in client text (Qwen3 splitting an inline `<think>...</think>` out of assistant
    history) does not fire and that text stays plain text; pass reasoning as
    `reasoning_content` instead. A template that builds a token out of client text by other
    means (`'<|' + message.role + '|>'`, slicing) is not covered: roles must be validated by
    the caller.

    `token_cache` (an `ignis.model.token_cache.TokenCache` of this tokenizer) gives the same
    ids while tokenizing only text it has not seen; `token_count` adds up what it did.
    `max_chars`: raise `PromptTooLong` instead of tokenizing a text longer than this.
    """
    def render(messages_: Any, tools_: Any, kwargs_: dict[str, Any]) -> str:
        return template.render(
            messages_,
            tools=tools_,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            **kwargs_,
        )

    neutral, originals = _neutralizer(tokenizer.control_tokens).neutralize(
        [messages, tools, kwargs], avoid="".join(template.templates.values())
    )
    if not originals:  # the ordinary case: one pass, exactly as transformers tokenizes
        text = render(messages, tools, kwargs)
        _check_length(tokenizer, len(text), text, max_chars)
        if token_cache is not None:
            return token_cache.encode(text, token_count)
        ids = tokenizer.encode(text, special=True, add_bos=False)
        if token_count is not None:
            token_count.tokenized += len(ids)
        return ids
    return _encode_around_markup(tokenizer, render(*neutral), originals, token_cache, token_count, max_chars)


def _encode_around_markup(
    tokenizer: Tokenizer,
    text: str,
    originals: dict[str, str],
    token_cache: TokenCache | None,
    token_count: TokenCount | None,
    max_chars: int | None,
) -> list[int]:
    """The ids of `text`, rendered from neutralized client strings: its added tokens (all
    the template's own), and the plain text between them with the client's strings put back."""
    spans = (token_cache or tokenizer).added_token_spans(text)
    starts = [0] + [end for _, end, _ in spans]
    stops = [start for start, _, _ in spans] + [len(text)]
    pieces = [Neutralizer.restore(text[a:b], originals) for a, b in zip(starts, stops)]
    # Each added-token span is one token, so the plain pieces alone bound the count from below.
    _check_length(tokenizer, sum(map(len, pieces)), pieces, max_chars)
    if token_cache is not None:
        plain = token_cache.encode_plain(pieces, token_count)
    else:
        plain = [tokenizer.encode(p, special=False, add_bos=False) for p in pieces]
        if token_count is not None:
            token_count.tokenized += sum(map(len, plain))
    ids: list[int] = list(plain[0])
    for (_, _, token_id), piece_ids in zip(spans, plain[1:]):
        ids.append(token_id)
        ids += piece_ids
    return ids


@lru_cache(maxsize=8)
def _neutralizer(control_tokens: tuple[str, ...]) -> Neutralizer:
    return Neutralizer(control_tokens)
