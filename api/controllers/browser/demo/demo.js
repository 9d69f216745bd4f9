// The demo page: starts a run with resumable-events.js and renders what arrives. Every event the
// module delivers becomes one row of #events (with its resume token and payload as data attributes),
// so what a person sees is exactly what the caller received.
import {
  RunGoneError, followRun, stopRun, streamRun, submitHumanInput,
} from "../static/durable-workflow/resumable-events.js";

/** @param {string} id @returns {any} */
const $ = (id) => document.getElementById(id);

/** @type {import("../static/durable-workflow/resumable-events.js").RunStream | null} */
let current = null;
let eventCount = 0;
let reconnects = 0;
/** @type {Map<string, HTMLLIElement>} */
const nodeRows = new Map();

function credentials() {
  return { apiKey: $("api-key").value.trim(), user: $("user").value.trim() };
}

/** @param {string} state */
function setState(state) {
  $("state").textContent = state;
  $("state").dataset.state = state;
  const live = state === "connecting" || state === "open" || state === "reconnecting";
  $("drop").disabled = !live;
  $("stop").disabled = !(live || state === "paused");
  $("start").disabled = live || state === "paused";
}

/** @param {string} text @param {string} [kind] */
function note(text, kind = "info") {
  const li = document.createElement("li");
  li.className = kind;
  li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  $("notes").append(li);
}

/** @param {any} event @param {{id: string, connection: number}} meta */
function onEvent(event, meta) {
  eventCount += 1;
  $("event-count").textContent = String(eventCount);
  const li = document.createElement("li");
  li.className = event.event;
  li.dataset.seq = String(eventCount);
  li.dataset.event = event.event;
  li.dataset.id = meta.id;
  li.dataset.connection = String(meta.connection);
  li.dataset.payload = JSON.stringify(event);
  const id = document.createElement("span");
  id.className = "id";
  id.textContent = ` #${meta.connection} ${meta.id.slice(0, 10)}…`;
  li.append(event.event + describe(event), id);
  $("events").append(li);
  if (event.workflow_run_id) $("run-id").textContent = event.workflow_run_id;
  render(event);
}

/** @param {any} event */
function describe(event) {
  const data = event.data || {};
  if (event.event === "text_chunk") return ` ${JSON.stringify(data.text)}`;
  if (event.event.startsWith("node_")) return ` ${data.node_id}${data.status ? ` ${data.status}` : ""}`;
  if (event.event === "workflow_finished") return ` ${data.status}`;
  return "";
}

/** @param {any} event */
function render(event) {
  const data = event.data || {};
  if (event.event === "text_chunk") {
    $("text").textContent += data.text;
  } else if (event.event === "node_started") {
    const li = document.createElement("li");
    li.textContent = `${data.title || data.node_id} (${data.node_type}) running…`;
    nodeRows.set(data.id, li);
    $("nodes").append(li);
  } else if (event.event === "node_finished") {
    const li = nodeRows.get(data.id) || document.createElement("li");
    if (!li.isConnected) $("nodes").append(li);
    li.className = `status-${data.status}`;
    li.textContent = `${data.title || data.node_id} (${data.node_type}) ${data.status} in ${(data.elapsed_time * 1000).toFixed(0)} ms`;
  } else if (event.event === "human_input_required") {
    showForm(data);
  } else if (event.event === "workflow_finished") {
    const box = $("outcome");
    box.hidden = false;
    box.className = data.status;
    box.textContent = "";
    const h2 = document.createElement("h2");
    h2.textContent = `Run ${data.status}`;
    const pre = document.createElement("pre");
    pre.id = "outputs";
    pre.textContent = JSON.stringify(data.error ? { error: data.error } : data.outputs, null, 2);
    box.append(h2, pre);
  }
}

/** @param {{title?: string, form?: Array<{name: string, type?: string, required?: boolean}>}} data */
function showForm(data) {
  $("pause-title").textContent = data.title || "";
  const fields = $("human-fields");
  fields.textContent = "";
  for (const field of data.form || []) {
    const label = document.createElement("label");
    const input = document.createElement("input");
    input.name = field.name;
    input.id = `human-${field.name}`;
    input.dataset.type = field.type || "text";
    if (field.type === "boolean") input.type = "checkbox";
    else if (field.type === "number") input.type = "number";
    else input.type = "text";
    label.append(input, ` ${field.name}${field.required === false ? " (optional)" : ""}`);
    fields.append(label);
  }
  $("human-submit").disabled = false;
}

/** @returns {Record<string, unknown>} */
function formValues() {
  /** @type {Record<string, unknown>} */
  const values = {};
  for (const input of $("human-fields").querySelectorAll("input")) {
    if (input.dataset.type === "boolean") values[input.name] = input.checked;
    else if (input.dataset.type === "number") { if (input.value !== "") values[input.name] = Number(input.value); }
    else if (input.value !== "") values[input.name] = input.value;
  }
  return values;
}

function callbacks() {
  return {
    ...credentials(),
    onEvent,
    onStateChange: setState,
    /** @param {{taskId: string, workflowRunId: string}} ids */
    onRunCreated: (ids) => {
      $("task-id").textContent = ids.taskId;
      $("run-id").textContent = ids.workflowRunId;
    },
    /** @param {{attempt: number, delayMs: number, reason: string, lastEventId: string}} info */
    onReconnect: (info) => {
      reconnects += 1;
      $("reconnects").textContent = String(reconnects);
      const after = info.lastEventId ? `after ${info.lastEventId.slice(0, 10)}…` : "from the start";
      note(`connection lost (${info.reason}); resuming ${after} in ${info.delayMs} ms (attempt ${info.attempt})`, "reconnect");
    },
  };
}

/** @param {import("../static/durable-workflow/resumable-events.js").RunStream} stream */
async function settle(stream) {
  current = stream;
  try {
    const outcome = await stream.done;
    if (outcome.status === "paused") {
      $("pause").hidden = false;
      note("the run is paused: fill in the form to resume it");
    } else {
      note(`the run ended: ${/** @type {any} */ (outcome.event.data || {}).status}`);
    }
  } catch (error) {
    const err = /** @type {any} */ (error);
    note(`${err.name}: ${err.message}`, "error");
    const box = $("outcome");
    box.hidden = false;
    box.className = "error";
    box.textContent = "";
    const h2 = document.createElement("h2");
    h2.textContent = err instanceof RunGoneError ? `Events gone (${err.code}); the run row:` : err.name;
    const pre = document.createElement("pre");
    pre.id = "error-detail";
    pre.textContent = JSON.stringify(err instanceof RunGoneError ? err.run : (err.body || err.message), null, 2);
    box.append(h2, pre);
  }
}

function reset() {
  eventCount = 0;
  reconnects = 0;
  nodeRows.clear();
  for (const id of ["events", "nodes", "notes", "text"]) $(id).textContent = "";
  $("event-count").textContent = "0";
  $("reconnects").textContent = "0";
  $("task-id").textContent = "–";
  $("run-id").textContent = "–";
  $("pause").hidden = true;
  $("outcome").hidden = true;
}

$("start-form").addEventListener("submit", (/** @type {SubmitEvent} */ e) => {
  e.preventDefault();
  let inputs;
  try {
    inputs = JSON.parse($("inputs").value);
  } catch (error) {
    note(`the inputs are not JSON: ${/** @type {Error} */ (error).message}`, "error");
    return;
  }
  reset();
  settle(streamRun({ ...callbacks(), inputs }));
});

$("drop").addEventListener("click", () => {
  if (current && current.drop()) note("dropped the connection on purpose");
});

$("stop").addEventListener("click", async () => {
  if (!current || !current.taskId) return;
  try {
    await stopRun({ ...credentials(), taskId: current.taskId });
    note("stop requested");
    if (current.state === "paused") settle(followRun({ ...callbacks(), taskId: current.taskId, lastEventId: current.lastEventId }));
  } catch (error) {
    note(`stop failed: ${/** @type {Error} */ (error).message}`, "error");
  }
});

$("human-form").addEventListener("submit", async (/** @type {SubmitEvent} */ e) => {
  e.preventDefault();
  if (!current || !current.workflowRunId) return;
  const paused = current;
  $("human-submit").disabled = true;
  try {
    await submitHumanInput({ ...credentials(), workflowRunId: String(paused.workflowRunId), inputs: formValues() });
  } catch (error) {
    note(`the form was refused: ${/** @type {Error} */ (error).message}`, "error");
    $("human-submit").disabled = false;
    return;
  }
  $("pause").hidden = true;
  note("form submitted; following the run again from the last event");
  settle(followRun({
    ...callbacks(), taskId: String(paused.taskId), workflowRunId: String(paused.workflowRunId), lastEventId: paused.lastEventId,
  }));
});

setState("idle");
