// The Playground's entry point: the API key, the model list, the header's socket
// state, and the panes (parallel agents, each one stream_id on the one socket).

import { Connection, describeHttpError } from "./connection.js";
import { Pane } from "./pane.js";
import { readSettings, restoreSettings, setModels } from "./settings.js";

// The server runs at most 16 streams of one connection at once; more panes would queue.
const MAX_PANES = 16;
// The key lives in this tab's sessionStorage: typed once, kept across reloads, never
// written to disk the way localStorage would.
const KEY_STORE = "ignis.playground.key";

const $ = (id) => document.getElementById(id);
const panes = [];
let paneCount = 0;

const connection = new Connection({ key: sessionStorage.getItem(KEY_STORE), onState: showSocketState });
const preferredModel = restoreSettings();

function showSocketState({ state, generation, code, reason, message }) {
  const node = $("socket-state");
  node.dataset.state = state;
  node.dataset.generation = String(generation);
  if (state === "open") {
    node.textContent = `socket #${generation} open`;
  } else if (state === "closed") {
    node.textContent = `socket #${generation} closed (${code}${reason ? `: ${reason}` : ""}); ` +
                       "the next turn opens a new one";
  } else {
    node.textContent = message;
  }
}

async function loadModels() {
  const status = $("key-status");
  const headers = connection.key ? { Authorization: `Bearer ${connection.key}` } : {};
  let resp;
  try {
    resp = await fetch("/v1/models", { headers });
  } catch (err) {
    status.textContent = `The server cannot be reached (${err.message}).`;
    return;
  }
  if (!resp.ok) {
    status.textContent = await describeHttpError(resp);
    $("key-box").classList.toggle("needed", resp.status === 401);
    return;
  }
  $("key-box").classList.remove("needed");
  status.textContent = connection.key ? "Key accepted." : "This server needs no key.";
  const body = await resp.json();
  setModels(body.data.map((m) => m.id), preferredModel);
}

function addPane() {
  if (panes.length >= MAX_PANES) return;
  paneCount += 1;
  const pane = new Pane({
    streamId: `agent-${paneCount}`,
    title: `Agent ${paneCount}`,
    connection,
    settings: readSettings,
    template: $("pane-template"),
    onRemove: (p) => {
      panes.splice(panes.indexOf(p), 1);
      updateAddButton();
    },
  });
  panes.push(pane);
  $("panes").append(pane.node);
  updateAddButton();
  pane.input.focus();
  return pane;
}

function updateAddButton() {
  $("add-pane").disabled = panes.length >= MAX_PANES;
  $("add-pane").title = panes.length >= MAX_PANES ? `At most ${MAX_PANES} agents` : "Open another agent";
}

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const key = $("set-key").value.trim();
  if (key) sessionStorage.setItem(KEY_STORE, key);
  else sessionStorage.removeItem(KEY_STORE);
  connection.setKey(key);
  $("set-key").value = "";
  $("set-key").placeholder = key ? "key set (type to replace)" : "none";
  loadModels();
});
$("set-key").placeholder = connection.key ? "key set (type to replace)" : "none";
$("add-pane").addEventListener("click", addPane);

addPane();
loadModels();

// For the console (and the browser test): the live objects.
window.ignis = { connection, panes, addPane };
