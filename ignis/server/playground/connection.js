// The one WebSocket every pane shares. Each pane is one `stream_id` on it, so any
// number of agents run at once without hitting the browser's six connections per host.
//
// Lifecycle (the Responses socket mode's rules, seen from a client):
// - The socket opens when a turn needs it, never before.
// - After any close (the server's idle close included) the next turn opens a new one.
//   Every socket has a generation number; a response id belongs to the generation
//   that produced it, since the server keeps responses per connection only. Panes
//   resend their full history when the generation changed.
// - While the tab is hidden, a socket no turn is using is closed after a minute.

const KEY_PREFIX = "openai-insecure-api-key.";
// Browsers drop a socket whose offered protocols got no answer, and the server never
// selects the key entry: offer a plain name too (OpenAI's browser convention).
const PLAIN_PROTOCOL = "realtime";
export const HIDDEN_CLOSE_MS = 60_000;

export class SocketRefused extends Error {}

export class Connection {
  constructor({ key = null, onState = () => {} } = {}) {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    this.url = `${scheme}//${location.host}/v1/responses`;
    this.key = key;
    this.onState = onState;
    this.ws = null;
    this.opening = null;
    this.generation = 0; // counts the sockets opened by this page
    this.streams = new Map(); // stream_id -> { onEvent(ev), onClose(info), busy() }
    this.hiddenCloseMs = HIDDEN_CLOSE_MS;
    this.hiddenTimer = null;
    document.addEventListener("visibilitychange", () => this.armHiddenClose());
  }

  setKey(key) {
    // An open socket was authenticated at its upgrade; the new key is for the next one.
    this.key = key || null;
  }

  register(streamId, handler) {
    this.streams.set(streamId, handler);
  }

  unregister(streamId) {
    this.streams.delete(streamId);
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  // Resolves once a socket is open (opening one if needed); rejects with
  // SocketRefused when the upgrade fails (a wrong key, the server gone).
  open() {
    if (this.isOpen) return Promise.resolve();
    if (this.opening) return this.opening;
    const protocols = [PLAIN_PROTOCOL];
    if (this.key) protocols.push(KEY_PREFIX + this.key);
    this.opening = new Promise((resolve, reject) => {
      let ws;
      try {
        ws = new WebSocket(this.url, protocols);
      } catch (err) {
        reject(new SocketRefused(String(err)));
        return;
      }
      let opened = false;
      let generation = 0;
      ws.onopen = () => {
        opened = true;
        this.ws = ws;
        generation = this.generation += 1;
        this.onState({ state: "open", generation });
        resolve();
      };
      ws.onmessage = (msg) => this.dispatch(msg.data);
      // `error` carries nothing useful in a browser; `close` always follows it.
      ws.onclose = (e) => {
        if (!opened) {
          reject(new SocketRefused(`the WebSocket upgrade failed (close code ${e.code})`));
          return;
        }
        this.closed(ws, { generation, code: e.code, reason: e.reason });
      };
    }).finally(() => {
      this.opening = null;
    });
    return this.opening;
  }

  // The reason a browser never tells: ask the server over HTTP with the same key.
  async whyRefused() {
    try {
      const headers = this.key ? { Authorization: `Bearer ${this.key}` } : {};
      const resp = await fetch("/v1/models", { headers });
      if (!resp.ok) return await describeHttpError(resp);
      return "The WebSocket could not be opened, though the server answers HTTP.";
    } catch (err) {
      return `The server cannot be reached (${err.message}).`;
    }
  }

  send(frame) {
    if (!this.isOpen) throw new Error("the socket is not open");
    this.ws.send(JSON.stringify(frame));
  }

  close(reason) {
    if (this.ws) this.ws.close(1000, reason);
  }

  // A socket closed. It may be an older one than `this.ws` (a new socket can open while
  // the old one is still closing): only turns sent on it end (see Pane.onClose).
  closed(ws, info) {
    if (this.ws === ws) {
      this.ws = null;
      this.onState({ state: "closed", ...info });
    }
    for (const handler of this.streams.values()) handler.onClose(info);
  }

  dispatch(data) {
    let ev;
    try {
      ev = JSON.parse(data);
    } catch {
      console.error("ignis playground: a frame that is not JSON", data);
      return;
    }
    const handler = this.streams.get(ev.stream_id ?? null);
    if (handler) {
      handler.onEvent(ev);
    } else if (ev.type === "error") {
      // Not tied to a pane (the frame's stream_id was unreadable): show it in the header.
      this.onState({ state: "error", generation: this.generation, message: errorText(ev) });
    }
  }

  get busy() {
    for (const handler of this.streams.values()) if (handler.busy()) return true;
    return false;
  }

  // Called on visibility changes and whenever a turn ends.
  armHiddenClose() {
    clearTimeout(this.hiddenTimer);
    this.hiddenTimer = null;
    if (document.visibilityState !== "hidden" || !this.ws) return;
    this.hiddenTimer = setTimeout(() => {
      this.hiddenTimer = null;
      // A running turn keeps it open; that turn's end re-arms the timer.
      if (document.visibilityState === "hidden" && !this.busy) {
        this.close("tab hidden with no turn running");
      }
    }, this.hiddenCloseMs);
  }
}

// "401 invalid_api_key: Incorrect API key ..." from OpenAI's error envelope.
export async function describeHttpError(resp) {
  let detail = resp.statusText;
  try {
    const body = await resp.json();
    if (body && body.error) detail = errorText({ status: resp.status, error: body.error });
  } catch {
    /* not JSON: keep the status text */
  }
  return detail.startsWith(String(resp.status)) ? detail : `${resp.status} ${detail}`;
}

export function errorText(ev) {
  const err = ev.error || {};
  const status = ev.status ? `${ev.status} ` : "";
  const code = err.code || err.type || "error";
  const param = err.param ? ` (param: ${err.param})` : "";
  return `${status}${code}: ${err.message || "no message"}${param}`;
}
