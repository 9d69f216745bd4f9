// The demo page: starts (or follows) a run with resumable-events.js and renders what arrives. Every
// event the module delivers becomes one row of #events (with its resume token and payload as data
// attributes), so what a person sees is exactly what the caller received.
import {
  RunGoneError, followRun, stopRun, streamRun, submitForm,
} from "../static/durable-workflow/resumable-events.js";

/** @param {string} id @returns {any} */
const $ = (id) => document.getElementById(id);

/** @type {import("../static/durable-workflow/resumable-events.js").RunStream | null} */
let current = null;
let eventCount = 0;
let reconnects = 0;
/** Connections of the run's earlier streams (the module numbers each stream's own from 0). */
let connectionBase = 0;
/** The highest connection number shown so far. */
let lastConnection = -1;
/** @type {Map<string, HTMLLIElement>} */
const nodeRows = new Map();

/**
 * The form the run waits for: a `human_input_required` payload (or a reason of `workflow_paused`).
 * @typedef {{form_token: string, node_id?: string, node_title?: string, form_content?: string,
 *   inputs?: Array<{type: string, output_variable_name: string, label?: string, required?: boolean,
 *                   default?: {type: string, value: unknown}}>,
 *   actions?: Array<{id: string, title?: string, button_style?: string}>,
 *   resolved_default_values?: Record<string, unknown>, expiration_time?: number}} OpenForm
 */
/** @type {OpenForm | null} */
let openForm = null;

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
  $("attach").disabled = live || state === "paused";
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
  const connection = connectionBase + meta.connection;
  lastConnection = Math.max(lastConnection, connection);
  li.dataset.connection = String(connection);
  li.dataset.payload = JSON.stringify(event);
  const id = document.createElement("span");
  id.className = "id";
  id.textContent = ` #${connection} ${meta.id.slice(0, 10)}…`;
  li.append(event.event + describe(event), id);
  $("events").append(li);
  if (event.workflow_run_id) $("run-id").textContent = event.workflow_run_id;
  if (event.task_id) $("task-id").textContent = event.task_id;
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
    // A resumed node starts again under the same execution id: its row, not a second one.
    const li = nodeRows.get(data.id) || document.createElement("li");
    li.className = "status-running";
    li.dataset.nodeId = data.node_id;
    li.textContent = `${data.title || data.node_id} (${data.node_type}) running…`;
    nodeRows.set(data.id, li);
    if (!li.isConnected) $("nodes").append(li);
  } else if (event.event === "node_finished") {
    const li = nodeRows.get(data.id) || document.createElement("li");
    if (!li.isConnected) $("nodes").append(li);
    li.className = `status-${data.status}`;
    li.textContent = `${data.title || data.node_id} (${data.node_type}) ${data.status} in ${(data.elapsed_time * 1000).toFixed(0)} ms`;
  } else if (event.event === "human_input_required") {
    markPaused(data);
    showForm(data);
  } else if (event.event === "human_input_form_filled" || event.event === "human_input_form_timeout") {
    hideForm();
  } else if (event.event === "workflow_finished") {
    hideForm();
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

/** The node a form belongs to waits for it: its row says so (not "running…"). @param {OpenForm} form */
function markPaused(form) {
  const rows = [...nodeRows.values()].filter((li) => li.dataset.nodeId === form.node_id);
  const li = rows[rows.length - 1];
  if (!li) return;
  li.className = "status-paused";
  li.textContent = `${form.node_title || form.node_id} (human-input) paused: waiting for its form`;
}

/** @param {OpenForm} form */
function showForm(form) {
  openForm = form;
  $("pause-title").textContent = form.node_title || form.node_id || "";
  $("form-content").textContent = form.form_content || "";
  const preset = form.resolved_default_values || {};
  const fields = $("human-fields");
  fields.textContent = "";
  for (const field of form.inputs || []) {
    const name = field.output_variable_name;
    const label = document.createElement("label");
    /** @type {HTMLInputElement | HTMLTextAreaElement | HTMLSelectElement} */
    let input;
    // Dify's form input types: paragraph, select, file, file-list. The demo takes files by URL.
    if (field.type === "select") {
      input = document.createElement("select");
      const options = (field.option_source && field.option_source.value) || [];
      for (const option of options) {
        const choice = document.createElement("option");
        choice.value = choice.textContent = String(option);
        input.append(choice);
      }
    } else if (field.type === "file" || field.type === "file-list") {
      input = document.createElement("input");
      input.type = "url";
      input.placeholder = field.type === "file" ? "https://… (a file's URL)" : "https://…, https://… (files' URLs)";
      input.dataset.fileType = (field.allowed_file_types && field.allowed_file_types[0]) || "document";
    } else {
      input = document.createElement("textarea");
      input.rows = 3;
      label.className = "paragraph";
    }
    input.name = name;
    input.id = `human-${name}`;
    input.dataset.type = field.type;
    const value = name in preset ? preset[name] : field.default ? field.default.value : undefined;
    if (value !== undefined && value !== null && value !== "") input.value = String(value);
    label.append(input, ` ${field.label || name}`);
    fields.append(label);
  }
  // One submit button per action: the one pressed names the action the form is submitted with.
  const actions = $("human-actions");
  actions.textContent = "";
  for (const action of form.actions || []) {
    const button = document.createElement("button");
    button.type = "submit";
    button.id = `human-action-${action.id}`;
    button.dataset.action = action.id;
    button.className = `action-${action.button_style || "default"}`;
    button.textContent = action.title || action.id;
    actions.append(button);
  }
  $("form-expiry").textContent = form.expiration_time
    ? `expires ${new Date(form.expiration_time * 1000).toLocaleString()}` : "";
}

function hideForm() {
  openForm = null;
  $("pause").hidden = true;
}

/** @param {boolean} disabled */
function disableActions(disabled) {
  for (const button of $("human-actions").querySelectorAll("button")) button.disabled = disabled;
}

/** @returns {Record<string, unknown>} */
function formValues() {
  /** @type {Record<string, unknown>} */
  const values = {};
  for (const input of $("human-fields").querySelectorAll("input, textarea, select")) {
    if (input.value === "") continue;
    const file = (/** @type {string} */ url) =>
      ({ type: input.dataset.fileType, transfer_method: "remote_url", url: url.trim() });
    if (input.dataset.type === "file") values[input.name] = file(input.value);
    else if (input.dataset.type === "file-list") values[input.name] = input.value.split(",").map(file);
    else values[input.name] = input.value;
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
  connectionBase = lastConnection + 1;  // a stream that follows the run on counts on from the last one
  try {
    const outcome = await stream.done;
    if (outcome.status === "paused") {
      const reasons = /** @type {any} */ (outcome.event.data || {}).reasons || [];
      if (!openForm && reasons.length) showForm(reasons[0]);
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
  connectionBase = 0;
  lastConnection = -1;
  nodeRows.clear();
  openForm = null;
  for (const id of ["events", "nodes", "notes", "text", "human-fields", "human-actions"]) $(id).textContent = "";
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

$("attach-form").addEventListener("submit", (/** @type {SubmitEvent} */ e) => {
  e.preventDefault();
  const runId = $("attach-id").value.trim();
  reset();
  $("run-id").textContent = runId;
  // No Last-Event-ID yet: the module asks for the run from its beginning (include_state_snapshot).
  settle(followRun({ ...callbacks(), workflowRunId: runId }));
});

$("drop").addEventListener("click", () => {
  if (current && current.drop()) note("dropped the connection on purpose");
});

$("stop").addEventListener("click", async () => {
  if (!current || !current.taskId) return;
  try {
    await stopRun({ ...credentials(), taskId: current.taskId });
    note("stop requested");
    if (current.state === "paused") {
      const { taskId, workflowRunId, lastEventId } = current;
      settle(followRun({ ...callbacks(), taskId, workflowRunId: workflowRunId || undefined, lastEventId }));
    }
  } catch (error) {
    note(`stop failed: ${/** @type {Error} */ (error).message}`, "error");
  }
});

$("human-form").addEventListener("submit", async (/** @type {SubmitEvent} */ e) => {
  e.preventDefault();
  if (!current || !openForm) return;
  const paused = current;
  const form = openForm;
  // Enter in a field submits with the first button, i.e. the form's first action.
  const action = e.submitter instanceof HTMLButtonElement ? e.submitter.dataset.action : undefined;
  disableActions(true);
  try {
    await submitForm({ ...credentials(), formToken: form.form_token, inputs: formValues(), action });
  } catch (error) {
    note(`the form was refused: ${/** @type {Error} */ (error).message}`, "error");
    disableActions(false);
    return;
  }
  hideForm();
  note("form submitted; following the run again from the last event");
  settle(followRun({
    ...callbacks(),
    taskId: paused.taskId || undefined,
    workflowRunId: paused.workflowRunId || undefined,
    lastEventId: paused.lastEventId,
  }));
});

setState("idle");
