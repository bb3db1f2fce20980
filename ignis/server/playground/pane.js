// One agent: a chat pane bound to one `stream_id` on the shared socket.
//
// Continuations send `previous_response_id` plus only the new items. The server keeps
// a stream's latest response for the lifetime of its connection only, so the pane
// also keeps the whole conversation (`history`) and resends it in full when the
// socket it chained from is gone, or when the server says the id is unknown.

import { SocketRefused, errorText } from "./connection.js";
import { Follower, TurnView } from "./transcript.js";

const KEPT = new Set(["completed", "incomplete", "cancelled"]); // what the server remembers

export class Pane {
  constructor({ streamId, title, connection, settings, template, onRemove }) {
    this.streamId = streamId;
    this.connection = connection;
    this.settings = settings; // () => the request fields of the side panel (may throw)
    this.history = []; // items the server has answered: the full input of a resend
    this.previous = null; // { id, generation } of the latest kept response
    this.turn = null; // the running turn: { input, view, responseId, resent }

    this.node = template.content.firstElementChild.cloneNode(true);
    this.node.dataset.streamId = streamId;
    this.node.querySelector(".pane-title").textContent = title;
    this.node.querySelector(".pane-stream").textContent = streamId;
    this.follower = new Follower(this.node.querySelector(".transcript"));
    this.input = this.node.querySelector("textarea");
    this.button = this.node.querySelector(".send");
    this.node.querySelector("form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.turn ? this.stop() : this.sendText();
    });
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        if (!this.turn) this.sendText();
      }
    });
    this.node.querySelector(".remove").addEventListener("click", () => {
      this.stop();
      connection.unregister(streamId);
      this.node.remove();
      onRemove(this);
    });
    connection.register(streamId, this);
    this.setRunning(false);
  }

  busy() {
    return this.turn !== null;
  }

  setRunning(running) {
    this.node.dataset.state = running ? "running" : "idle";
    this.button.textContent = running ? "Stop" : "Send";
    this.button.classList.toggle("stop", running);
  }

  sendText() {
    const text = this.input.value.trim();
    if (!text) return;
    this.input.value = "";
    this.send([{ type: "message", role: "user", content: text }]);
  }

  // Starts a turn with these input items; false when none started (one is running, or
  // the side panel's settings are unreadable: that turn shows why).
  send(input) {
    if (this.turn) return false;
    const view = new TurnView(this.follower, input, { onToolResult: (item) => this.send([item]) });
    let fields;
    try {
      fields = this.settings();
    } catch (err) {
      view.error(err.message);
      view.setStatus("error", "not sent");
      return false;
    }
    const turn = { input, view, fields, responseId: null, resent: false, generation: 0 };
    this.turn = turn;
    this.setRunning(true);
    this.start(turn);
    return true;
  }

  async start(turn) {
    try {
      await this.connection.open();
    } catch (err) {
      turn.view.error(err instanceof SocketRefused ? await this.connection.whyRefused() : err.message);
      this.finish(turn, null);
      return;
    }
    this.submit(turn, false);
  }

  submit(turn, full) {
    const chain = !full && this.previous !== null && this.previous.generation === this.connection.generation;
    const frame = { type: "response.create", stream_id: this.streamId, ...turn.fields };
    if (chain) {
      frame.previous_response_id = this.previous.id;
      frame.input = turn.input;
    } else {
      frame.input = [...this.history, ...turn.input];
      if (this.history.length) {
        const why = full ? "the server no longer knows the previous response" : "new socket";
        turn.view.note(`${why}: resent the full history (${this.history.length} items)`);
      }
    }
    turn.view.setStatus("running", "waiting for the server…");
    turn.generation = this.connection.generation; // the socket this turn runs on
    try {
      this.connection.send(frame);
    } catch (err) {
      turn.view.error(err.message);
      this.finish(turn, null);
    }
  }

  stop() {
    const turn = this.turn;
    if (!turn || !this.connection.isOpen) return;
    const frame = { type: "response.cancel", stream_id: this.streamId };
    if (turn.responseId) frame.response_id = turn.responseId;
    this.connection.send(frame);
    turn.view.setStatus("running", "stopping…");
  }

  // Every frame of this pane's stream_id.
  onEvent(ev) {
    const turn = this.turn;
    if (!turn) return; // a late frame of a turn that already ended (socket closed)
    const view = turn.view;
    switch (ev.type) {
      case "error":
        if (ev.error?.code === "previous_response_not_found" && !turn.resent) {
          turn.resent = true; // the server forgot the chain: send everything once
          this.submit(turn, true);
          return;
        }
        view.error(errorText(ev));
        this.finish(turn, null);
        return;
      case "response.created":
        turn.responseId = ev.response.id;
        view.setStatus("running", "created");
        return;
      case "response.queued":
        view.setStatus("running", "queued: the engine is full");
        return;
      case "response.in_progress":
        view.setStatus("running", "generating…");
        return;
      case "response.output_item.added":
        view.item(ev.output_index, ev.item);
        return;
      case "response.output_text.delta":
      case "response.reasoning_text.delta":
      case "response.reasoning_summary_text.delta":
      case "response.function_call_arguments.delta":
        view.delta(ev.output_index, ev.delta);
        return;
      case "response.output_item.done":
        view.itemDone(ev.output_index, ev.item);
        return;
      case "response.completed":
      case "response.incomplete":
      case "response.failed":
        this.finish(turn, ev.response);
        return;
      default:
        return; // content_part.*, *.done texts: the deltas already built them
    }
  }

  onClose({ generation, code, reason }) {
    const turn = this.turn;
    if (!turn || turn.generation !== generation) return; // not sent on that socket
    turn.view.error(`The socket closed during this turn (code ${code}${reason ? `: ${reason}` : ""}).`);
    this.finish(turn, null);
  }

  finish(turn, response) {
    if (this.turn !== turn) return;
    if (response && KEPT.has(response.status)) {
      this.history.push(...turn.input, ...response.output);
      this.previous = { id: response.id, generation: this.connection.generation };
    }
    turn.view.finish(response);
    this.turn = null;
    this.setRunning(false);
    this.connection.armHiddenClose();
  }
}
