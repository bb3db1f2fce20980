// The DOM of one pane's conversation: one <article class="turn"> per turn, with the
// user's input, the output items as they stream (answer text, a collapsible
// reasoning block, tool-call cards), a status line and any error.
//
// Model output is only ever set through textContent: the page never renders it as HTML.

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// Keeps a scrolling transcript at its bottom while output streams in, unless the
// reader scrolled up to read; layout changes (more panes, a resized window) keep it too.
export class Follower {
  constructor(container) {
    this.container = container;
    this.pinned = true;
    container.addEventListener("scroll", () => {
      this.pinned = container.scrollHeight - container.scrollTop - container.clientHeight < 40;
    });
    new ResizeObserver(() => this.pinned && this.toBottom()).observe(container);
  }

  toBottom() {
    this.container.scrollTop = this.container.scrollHeight;
  }

  follow(change) {
    change();
    if (this.pinned) this.toBottom();
  }
}

export class TurnView {
  constructor(follower, input, { onToolResult }) {
    this.follower = follower;
    this.onToolResult = onToolResult;
    this.items = new Map(); // output_index -> { kind, node, body }
    this.started = performance.now();
    this.node = el("article", "turn");
    this.node.dataset.status = "sending";
    for (const item of input) this.node.append(inputNode(item));
    this.output = el("div", "output");
    this.status = el("div", "turn-status", "sending…");
    this.node.append(this.output, this.status);
    follower.pinned = true; // the user just sent this turn: show it
    follower.follow(() => follower.container.append(this.node));
  }

  follow(change) {
    this.follower.follow(change);
  }

  note(text) {
    this.follow(() => this.node.insertBefore(el("div", "note", text), this.output));
  }

  setStatus(status, text) {
    this.node.dataset.status = status;
    this.status.textContent = text ?? status;
  }

  item(index, item) {
    let entry;
    if (item.type === "reasoning") {
      const details = el("details", "reasoning");
      const summary = el("summary", null, "Reasoning…");
      const body = el("div", "reasoning-text");
      details.append(summary, body);
      entry = { kind: "reasoning", node: details, body, summary };
    } else if (item.type === "function_call") {
      entry = toolCard(item, this.onToolResult);
    } else {
      const body = el("div", "msg assistant");
      body.dataset.deltas = "0";
      entry = { kind: "message", node: body, body };
    }
    this.items.set(index, entry);
    this.follow(() => this.output.append(entry.node));
  }

  // A delta of answer text, reasoning text or tool-call arguments.
  delta(index, text) {
    const entry = this.items.get(index);
    if (!entry) return;
    this.follow(() => {
      entry.body.textContent += text;
      entry.body.dataset.deltas = String(Number(entry.body.dataset.deltas || 0) + 1);
    });
  }

  itemDone(index, item) {
    const entry = this.items.get(index);
    if (!entry) return;
    if (entry.kind === "reasoning") {
      const n = entry.body.textContent.length;
      entry.summary.textContent = `Reasoning (${n} characters)`;
    } else if (entry.kind === "tool") {
      entry.body.textContent = prettyJson(item.arguments ?? entry.body.textContent);
      entry.callId = item.call_id;
    }
  }

  // The terminal event's response (or null when the turn ended without one).
  finish(response) {
    const seconds = ((performance.now() - this.started) / 1000).toFixed(2);
    if (!response) {
      this.setStatus("error", `no response · ${seconds} s`);
      return;
    }
    const status = response.status;
    const u = response.usage || {};
    const cached = u.input_tokens_details?.cached_tokens ?? 0;
    const why = response.incomplete_details?.reason ? ` (${response.incomplete_details.reason})` : "";
    this.follow(() => this.setStatus(status, `${status}${why} · ${u.input_tokens ?? 0} in (${cached} cached) · ` +
                           `${u.output_tokens ?? 0} out · ${seconds} s`));
    if (status === "failed" && response.error) {
      this.error(`${response.error.code}: ${response.error.message}`);
    }
    // Tool cards take a result only once the turn that called them is over.
    for (const entry of this.items.values()) if (entry.kind === "tool") entry.form.hidden = false;
  }

  error(text) {
    this.follow(() => this.node.append(el("div", "error", text)));
  }
}

function inputNode(item) {
  if (item.type === "function_call_output") {
    const node = el("div", "msg tool-result");
    node.append(el("div", "label", `tool result · ${item.call_id}`), el("pre", null, item.output));
    return node;
  }
  return el("div", "msg user", typeof item.content === "string" ? item.content : JSON.stringify(item.content));
}

function toolCard(item, onToolResult) {
  const node = el("div", "tool-card");
  const name = el("div", "tool-name", `tool call · ${item.name}`);
  const body = el("pre", "tool-args", item.arguments || "");
  body.dataset.deltas = "0";
  const form = el("form", "tool-form");
  form.hidden = true;
  const output = el("input");
  output.placeholder = "result to send back";
  output.setAttribute("aria-label", "tool result");
  const send = el("button", null, "Send result");
  send.type = "submit";
  form.append(output, send);
  const entry = { kind: "tool", node, body, form, callId: item.call_id };
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    // A result goes back once; the pane refuses it while another turn runs.
    if (onToolResult({ type: "function_call_output", call_id: entry.callId, output: output.value })) {
      form.replaceWith(el("div", "label", "result sent"));
    }
  });
  node.append(name, body, form);
  return entry;
}

function prettyJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text; // the model's arguments need not be valid JSON
  }
}
