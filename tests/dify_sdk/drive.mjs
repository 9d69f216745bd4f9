// Drives Dify's official Node SDK (dify-client, pinned in package.json) against our server, unchanged,
// and reports what a Dify client sees. Run by tests/app/test_dify_node_sdk.py, which asserts on it.
//
//   node drive.mjs <base url, e.g. http://127.0.0.1:5001/v1> <api key> <user> <scenario>
//
// Scenarios: blocking, streaming, stop, human_input, app (parameters, an upload, a chat call). Prints one JSON object on stdout; exit 0 when
// every request was made and every stream read to its end (whether the server's answers are right
// is the test's to judge), exit 1 with the error and whatever was seen before it otherwise.

import { ChatClient, CompletionClient } from "dify-client";

// Below the test's subprocess timeout, so a hung stream still reports what it had seen.
const WATCHDOG_MS = 50_000;

const [baseUrl, apiKey, user, scenario] = process.argv.slice(2);
const report = { scenario: scenario ?? null };

// Dify's web front end reads event streams like this: messages are separated by blank lines, every
// `data:` line is one JSON event dispatched on its `event` field; pings and `id:` lines are ignored.
// A data object without `event` is how Dify reports an error in a stream, and the web stops there.
class SseParser {
  constructor() {
    this.decoder = new TextDecoder("utf-8");
    this.buffer = "";
    this.pings = 0;
    this.idLines = 0;
    this.bareDataLines = 0;
  }

  push(chunk) {
    this.buffer += typeof chunk === "string" ? chunk : this.decoder.decode(chunk, { stream: true });
    const messages = this.buffer.split(/\r\n\r\n|\n\n|\r\r/);
    this.buffer = messages.pop();
    return messages.flatMap((message) => this.parse(message));
  }

  end() {
    const rest = this.buffer + this.decoder.decode();
    this.buffer = "";
    return rest.trim() === "" ? [] : this.parse(rest);
  }

  parse(message) {
    const lines = message.split(/\r\n|\n|\r/);
    if (lines.some((line) => /^event:\s*ping\s*$/.test(line))) {
      this.pings += 1;
      return [];
    }
    const events = [];
    for (const line of lines) {
      if (line.startsWith("id:")) {
        this.idLines += 1;
      } else if (line.startsWith("data:")) {
        // The web front end only reads `data: ` (with the space); count the lines it would miss.
        if (!line.startsWith("data: ")) this.bareDataLines += 1;
        events.push(JSON.parse(line.slice(5).replace(/^ /, "")));
      }
    }
    return events;
  }
}

function pickHeaders(get) {
  return {
    "content-type": get("content-type") ?? null,
    "x-task-id": get("x-task-id") ?? null,
    "x-workflow-run-id": get("x-workflow-run-id") ?? null,
  };
}

function newStreamRecord(status, headers) {
  return { status, headers, events: [], pings: 0, id_lines: 0, bare_data_lines: 0, ended_by: null };
}

// Feeds decoded chunks to the parser and every event to `onEvent`; `onEvent` returning true means
// "done, stop reading" (as a client does once it has what it waited for).
async function consume(chunks, record, onEvent, cancel) {
  const parser = new SseParser();
  const handle = async (events) => {
    for (const event of events) {
      record.events.push(event);
      if (!event || typeof event !== "object" || !event.event) {
        record.ended_by = "error";
        return true;
      }
      if (await onEvent(event)) {
        record.ended_by = event.event;
        return true;
      }
    }
    return false;
  };
  try {
    for await (const chunk of chunks) {
      if (await handle(parser.push(chunk))) {
        await cancel();
        return;
      }
    }
    record.ended_by = "eof";
    await handle(parser.end());
  } finally {
    record.pings = parser.pings;
    record.id_lines = parser.idLines;
    record.bare_data_lines = parser.bareDataLines;
  }
}

// An axios response with responseType "stream": `data` is a Node readable.
async function readAxiosStream(response, record, onEvent = async () => false) {
  await consume(response.data, record, onEvent, async () => response.data.destroy());
}

// A fetch response, read through its body's reader as the web front end does.
async function readFetchStream(response, record, onEvent = async () => false) {
  const reader = response.body.getReader();
  async function* chunks() {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      yield value;
    }
  }
  await consume(chunks(), record, onEvent, async () => reader.cancel());
}

async function fetchJson(method, path, body) {
  const response = await fetch(`${baseUrl}${path}`, {
    method,
    headers: { Authorization: `Bearer ${apiKey}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = { unparsed_body: text };
  }
  return { status: response.status, body: parsed };
}

async function streamingRun(client, inputs, key, onEvent) {
  const response = await client.runWorkflow(inputs, user, true);
  const record = newStreamRecord(response.status, pickHeaders((name) => response.headers[name]));
  report[key] = record;
  await readAxiosStream(response, record, onEvent);
  return record;
}

// The answer of a request the server refuses: axios throws; what a client sees is its status and body.
async function refused(call) {
  try {
    const response = await call();
    return { status: response.status, body: response.data };
  } catch (error) {
    if (!error?.response) throw error;
    return { status: error.response.status, body: error.response.data };
  }
}

const scenarios = {
  async blocking(client) {
    const response = await client.runWorkflow({ name: "Ada" }, user, false);
    report.status = response.status;
    report.body = response.data;
  },

  async streaming(client) {
    await streamingRun(client, { name: "Ada" }, "run");
  },

  async stop(client) {
    report.stop = null;
    await streamingRun(client, { name: "Ada" }, "run", async (event) => {
      if (event.event === "text_chunk" && report.stop === null) {
        // Events the client had when it asked; what follows shows how the run wound down.
        report.stop_after_events = report.run.events.length;
        const answer = await client.sendRequest("POST", `/workflows/tasks/${event.task_id}/stop`, { user });
        report.stop = { status: answer.status, body: answer.data };
      }
      return false;
    });
  },

  async app(client) {
    const parameters = await client.getApplicationParameters(user);
    report.parameters = { status: parameters.status, body: parameters.data };
    const form = new FormData();
    form.append("file", new Blob(["hello from node"], { type: "text/plain" }), "node.txt");
    form.append("user", user);
    const uploaded = await client.fileUpload(form);
    report.upload = { status: uploaded.status, body: uploaded.data };
    const chat = new ChatClient(apiKey, baseUrl);
    report.chat = await refused(() => chat.createChatMessage({}, "hi", user, false, null));
  },

  async human_input(client) {
    const run = await streamingRun(client, { name: "Ada", mood: "formal" }, "run");
    const required = run.events.find((event) => event.event === "human_input_required");
    if (!required) throw new Error("the stream carried no human_input_required event");
    const token = required.data?.form_token;
    if (!token) throw new Error("human_input_required has no form_token");
    const formPath = `/form/human_input/${encodeURIComponent(token)}`;

    report.form = await fetchJson("GET", formPath);
    if (report.form.status !== 200) throw new Error(`GET ${formPath} answered ${report.form.status}`);
    const action = report.form.body?.user_actions?.[0]?.id;
    const submission = { inputs: { approved: "true" }, action, user };
    report.submitted_action = action ?? null;
    report.submit = await fetchJson("POST", formPath, submission);
    report.submit_again = await fetchJson("POST", formPath, submission);

    const runId = required.workflow_run_id;
    const query = new URLSearchParams({ user, include_state_snapshot: "true" });
    const response = await fetch(`${baseUrl}/workflow/${encodeURIComponent(runId)}/events?${query}`, {
      headers: { Authorization: `Bearer ${apiKey}` },
    });
    const events = newStreamRecord(response.status, pickHeaders((name) => response.headers.get(name)));
    report.events = events;
    if (!response.ok) {
      events.body = await response.text();
      throw new Error(`GET /workflow/${runId}/events answered ${response.status}`);
    }
    await readFetchStream(response, events, async (event) => event.event === "workflow_finished");
  },
};

async function readText(stream) {
  let text = "";
  for await (const chunk of stream) text += typeof chunk === "string" ? chunk : Buffer.from(chunk).toString();
  return text;
}

// An axios error carries the server's answer; for a streaming request its body is still a stream.
async function describe(error) {
  const described = { message: String(error?.message ?? error), stack: error?.stack ?? null };
  const response = error?.response;
  if (response) {
    described.status = response.status;
    let body = response.data;
    if (body && typeof body.pipe === "function") {
      body = await readText(body).catch((failure) => `<unreadable: ${failure}>`);
    }
    described.body = body;
  }
  return described;
}

function finish(code) {
  process.stdout.write(`${JSON.stringify(report)}\n`, () => process.exit(code));
}

async function main() {
  if (!baseUrl || !apiKey || !user || !Object.hasOwn(scenarios, scenario ?? "")) {
    throw new Error(`usage: node drive.mjs <base url> <api key> <user> <${Object.keys(scenarios).join("|")}>`);
  }
  await scenarios[scenario](new CompletionClient(apiKey, baseUrl));
}

setTimeout(() => {
  report.error = { message: `timed out after ${WATCHDOG_MS} ms` };
  finish(1);
}, WATCHDOG_MS).unref();

main().then(
  () => finish(0),
  async (error) => {
    report.error = await describe(error);
    process.stderr.write(`drive.mjs ${scenario}: ${report.error.message}\n`);
    finish(1);
  },
);
