"""The scripted model: SmolLM2's tokenizer and chat template, logits from a script.

For tests and experiments only (`+model=scripted model.script=FILE`). Agent loops need
a model whose output is known: SmolLM2-135M rarely writes a well-formed tool call.
This model answers each conversation with the reply its script chooses, one token per
step, putting all the probability mass on the next token of that reply (then on
`<|im_end|>`). Everything else is the production path: the engine, scheduler, paged KV
cache and prefix cache, the sampler, the output parser and the server.

The script (YAML or JSON) picks a reply by the latest message before the assistant
turn, as the chat template rendered it (a tool result arrives as a user message
holding ``<tool_response>...</tool_response>``)::

    rules:                                  # the first rule that matches wins
      - contains: "<tool_response>"         # substring of the latest message's text
        reply: "The command printed hello."
      - regex: "(?i)run .*echo"             # or a Python regex searched in it
        role: user                          # optional: the role as rendered
        reply: |-
          <think>The user wants a shell command.</think>
          <tool_call>
          {"name": "exec_command", "arguments": {"cmd": "echo hello"}}
          </tool_call>
    default: "I have no scripted answer for that."   # when no rule matches

A rule may also say ``fail_after: N``: the forward raises `ScriptedFault` once N tokens
of its reply are written, an engine fault in the middle of a stream for the tests of
how one request's failure ends (test-only, like the whole model).

How it knows the conversation: the forward writes each token id into the paged KV
cache (one KV head of width 2: the id, and 1 to mark the slot written) and, at the
last position of each sequence in the step, reads the sequence's ids back through
its block table. So it sees exactly what the cache holds, prefix-cache hits and
preemption included, and keeps no state of its own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

import ignis_kernels
from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.config import ModelConfig
from ignis.model.kv_cache import KVCaches

# Codex's first request alone is ~10k tokens; the KV cache of this model costs 16 bytes
# a token, so a long context is free.
CONTEXT_LENGTH = 65536
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


class ScriptError(ValueError):
    pass


class ScriptedFault(RuntimeError):
    """Raised by the forward where a rule's `fail_after` says: an injected engine fault."""


@dataclass(frozen=True)
class Rule:
    reply: str
    contains: str | None = None
    regex: re.Pattern[str] | None = None
    role: str | None = None
    fail_after: int | None = None  # raise ScriptedFault once this many reply tokens are out

    def matches(self, role: str, text: str) -> bool:
        if self.role is not None and self.role != role:
            return False
        if self.contains is not None and self.contains not in text:
            return False
        return self.regex is None or self.regex.search(text) is not None


@dataclass(frozen=True)
class Script:
    rules: tuple[Rule, ...]
    default: str

    @classmethod
    def from_dict(cls, data: Any, source: str = "script") -> Script:
        if not isinstance(data, dict) or not isinstance(data.get("rules", []), list):
            raise ScriptError(f"{source}: expected a mapping with a list under 'rules'")
        unknown = set(data) - {"rules", "default"}
        if unknown:
            raise ScriptError(f"{source}: unknown keys {sorted(unknown)}")
        rules = []
        for i, raw in enumerate(data.get("rules", [])):
            where = f"{source}: rules[{i}]"
            if not isinstance(raw, dict) or not isinstance(raw.get("reply"), str):
                raise ScriptError(f"{where} needs a string 'reply'")
            extra = set(raw) - {"reply", "contains", "regex", "role", "fail_after"}
            if extra:
                raise ScriptError(f"{where}: unknown keys {sorted(extra)}")
            if "contains" not in raw and "regex" not in raw and "role" not in raw:
                raise ScriptError(f"{where} needs 'contains', 'regex' or 'role' to match on")
            try:
                pattern = re.compile(raw["regex"]) if "regex" in raw else None
            except (re.error, TypeError) as exc:
                raise ScriptError(f"{where}: bad regex: {exc}") from None
            fail_after = raw.get("fail_after")
            if fail_after is not None and (not isinstance(fail_after, int) or fail_after < 0):
                raise ScriptError(f"{where}: 'fail_after' must be an integer >= 0")
            rules.append(Rule(raw["reply"], raw.get("contains"), pattern, raw.get("role"), fail_after))
        default = data.get("default", "")
        if not isinstance(default, str):
            raise ScriptError(f"{source}: 'default' must be a string")
        return cls(tuple(rules), default)

    @classmethod
    def load(cls, path: str | Path) -> Script:
        p = Path(path).expanduser()
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ScriptError(f"cannot read the script {p}: {exc}") from None
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
        return cls.from_dict(data, str(p))

    def rule_for(self, role: str, text: str) -> Rule:
        return next((r for r in self.rules if r.matches(role, text)), Rule(self.default))


class ScriptedModel(nn.Module):
    """Same interface as `Transformer`: forward -> "hidden" [T, 1] holding, at each
    sequence's last row, the next token id (-1 elsewhere); compute_logits -> one-hot."""

    def __init__(self, script: Script, tokenizer: Any, eos_token_id: int, *, device: str | torch.device = "cpu") -> None:
        super().__init__()
        self.script = script
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.im_start = tokenizer.token_to_id(IM_START)
        self.im_end = tokenizer.token_to_id(IM_END)
        if self.im_start is None or self.im_end is None:
            raise ScriptError("the scripted model needs a ChatML tokenizer (<|im_start|>, <|im_end|>)")
        self.header = tokenizer.encode(f"{IM_START}assistant\n", special=True, add_bos=False)
        self.config = ModelConfig(
            family="llama", vocab_size=tokenizer.vocab_size, hidden_size=2, num_layers=1, num_heads=1,
            num_kv_heads=1, head_dim=2, intermediate_size=2, max_position_embeddings=CONTEXT_LENGTH,
            eos_token_ids=(eos_token_id,),
        )
        self.dtype = torch.float32  # ids up to 2**24 are exact in fp32
        # A buffer only so .device works like the Transformer's.
        self.register_buffer("_anchor", torch.zeros(1, device=device), persistent=False)
        self._replies: dict[str, list[int]] = {}

    @property
    def device(self) -> torch.device:
        return self._anchor.device

    def reply_ids(self, reply: str) -> list[int]:
        ids = self._replies.get(reply)
        if ids is None:
            ids = self.tokenizer.encode(reply, add_bos=False) + [self.eos_token_id]
            self._replies[reply] = ids
        return ids

    def next_token(self, ids: np.ndarray) -> int:
        """The script's next token for a sequence whose ids so far are `ids`."""
        starts = np.flatnonzero(ids == self.im_start)
        n = len(self.header)
        # The assistant turn being written starts at the last <|im_start|>assistant\n.
        turn = next(
            (int(s) for s in starts[::-1] if ids[s : s + n].tolist() == self.header), None
        )
        if turn is None:
            return self.reply_ids(self.script.default)[0]
        generated = len(ids) - turn - n
        role, text = "", ""
        before = starts[starts < turn]
        if len(before):
            start = int(before[-1])
            ends = np.flatnonzero(ids[start:turn] == self.im_end)
            end = start + int(ends[0]) if len(ends) else turn
            role, _, text = self.tokenizer.decode(ids[start + 1 : end].tolist()).partition("\n")
        rule = self.script.rule_for(role, text)
        if rule.fail_after is not None and generated >= rule.fail_after:
            raise ScriptedFault(f"scripted fault after {rule.fail_after} tokens")
        reply = self.reply_ids(rule.reply)
        return reply[generated] if generated < len(reply) else self.eos_token_id

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: KVCaches, meta: AttentionMetadata
    ) -> torch.Tensor:
        k_cache, v_cache = kv_caches[0]
        rows = torch.stack((input_ids.to(torch.float32), torch.ones_like(input_ids, dtype=torch.float32)), dim=-1)
        ignis_kernels.write_kv(rows[:, None, :], rows[:, None, :], k_cache, v_cache, meta.slot_mapping)
        out = torch.full((input_ids.shape[0], 1), -1.0, device=input_ids.device)
        block_size = k_cache.shape[1]
        written = k_cache.view(-1, 2)[:, 0]  # the per-layer cache views are contiguous
        tables = meta.block_tables.cpu().numpy()
        lens = meta.seq_lens.cpu().numpy()
        ends = meta.query_start_loc.cpu().numpy()[1:] - 1
        for s, (length, last) in enumerate(zip(lens.tolist(), ends.tolist())):
            pos = np.arange(length)
            slots = tables[s, pos // block_size].astype(np.int64) * block_size + pos % block_size
            ids = written[torch.from_numpy(slots).to(written.device)].long().cpu().numpy()
            out[last, 0] = self.next_token(ids)
        return out

    def compute_logits(self, hidden: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        if indices is not None:
            hidden = hidden[indices]
        ids = hidden[:, 0].long().clamp(min=0)
        logits = torch.full((hidden.shape[0], self.config.vocab_size), float("-inf"), device=hidden.device)
        logits.scatter_(1, ids[:, None], 0.0)
        return logits


def load_scripted(script_path: str | None, device: torch.device) -> tuple[ScriptedModel, Any, Any, int]:
    """(model, tokenizer, chat template, eos id) over the embedded SmolLM2's tokenizer."""
    import gguf

    from ignis.model.chat_template import ChatTemplate
    from ignis.model.embedded import smollm2_gguf_path
    from ignis.model.tokenizer import Tokenizer

    if not script_path:
        raise ScriptError("the scripted model needs model.script=FILE (a YAML or JSON script)")
    script = Script.load(script_path)
    reader = gguf.GGUFReader(smollm2_gguf_path())
    tokenizer = Tokenizer.from_gguf(reader)
    template = ChatTemplate.from_gguf(reader)
    eos = tokenizer.token_to_id(IM_END)
    return ScriptedModel(script, tokenizer, eos, device=device), tokenizer, template, eos
