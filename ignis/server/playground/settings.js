// The side panel: the request fields every pane's next turn uses.
//
// Values go to the server as typed (a temperature of 5 is sent, and the server's
// refusal shows in the pane): the server is the one place that validates.
// Settings persist in localStorage; the API key does not (see app.js).

const STORE = "ignis.playground.settings";
const FIELDS = ["model", "instructions", "temperature", "top_p", "top_k", "max_output_tokens", "effort", "tools"];

function field(name) {
  return document.getElementById(`set-${name}`);
}

function number(name) {
  const raw = field(name).value.trim();
  if (raw === "") return undefined; // the server's default
  const value = Number(raw);
  return Number.isNaN(value) ? raw : value;
}

// The fields of a response.create frame (throws on unreadable tools JSON).
export function readSettings() {
  const out = { model: field("model").value };
  const instructions = field("instructions").value.trim();
  if (instructions) out.instructions = instructions;
  for (const name of ["temperature", "top_p", "top_k", "max_output_tokens"]) {
    const value = number(name);
    if (value !== undefined) out[name] = value;
  }
  const effort = field("effort").value;
  if (effort) out.reasoning = { effort };
  const tools = field("tools").value.trim();
  if (tools) {
    let parsed;
    try {
      parsed = JSON.parse(tools);
    } catch (err) {
      throw new Error(`Tools: not JSON (${err.message}).`);
    }
    out.tools = Array.isArray(parsed) ? parsed : [parsed];
  }
  return out;
}

export function restoreSettings() {
  let saved = {};
  try {
    saved = JSON.parse(localStorage.getItem(STORE) || "{}");
  } catch {
    /* a damaged entry: start from the defaults */
  }
  for (const name of FIELDS) {
    if (name !== "model" && typeof saved[name] === "string") field(name).value = saved[name];
  }
  for (const name of FIELDS) {
    field(name).addEventListener("change", () => {
      const now = Object.fromEntries(FIELDS.map((n) => [n, field(n).value]));
      localStorage.setItem(STORE, JSON.stringify(now));
    });
  }
  return saved.model;
}

export function setModels(names, preferred) {
  const select = field("model");
  select.replaceChildren(...names.map((name) => new Option(name, name)));
  if (names.includes(preferred)) select.value = preferred;
}
