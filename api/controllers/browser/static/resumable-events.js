// Resumable workflow event streams for browsers: no dependencies, no build step.
//
// Served by the API at /static/durable-workflow/resumable-events.js. It streams a run's events with
// fetch + ReadableStream (so it can send the Authorization header, which EventSource cannot), parses
// server-sent events as the HTML standard says, and after any drop resumes strictly after the last
// event it delivered (Last-Event-ID), so the caller sees every event exactly once, in order. A run's
// start carries an Idempotency-Key, so a POST cut before its answer is sent again without starting a
// second run; the answer's headers (X-Task-Id, X-Workflow-Run-Id) name the run before any event.
//
//   import { streamRun } from "/static/durable-workflow/resumable-events.js";
//   const run = streamRun({ baseUrl: "", apiKey, user: "me", inputs: { name: "Ada" }, onEvent: (e) => … });
//   const outcome = await run.done;   // { status: "finished" | "paused", event, lastEventId, … }

/**
 * One server-sent event as the HTML standard's parser dispatches it.
 * @typedef {Object} SseMessage
 * @property {string} event        the event type ("message" when the message had no `event:` field)
 * @property {string} data         the data lines joined with "\n"
 * @property {string} lastEventId  the stream's last event id after this message (ids persist between messages)
 * @property {boolean} hasId       whether this message itself carried an `id:` field
 */

/**
 * A workflow event: `{event, task_id, workflow_run_id, data}`.
 * @typedef {Object} WorkflowEvent
 * @property {string} event
 * @property {string} [task_id]
 * @property {string} [workflow_run_id]
 * @property {Object} [data]
 */

/**
 * @typedef {Object} EventMeta
 * @property {string} id          the event's resume token ("" for an event without one)
 * @property {number} connection  which connection (0 = the first) delivered it
 */

/**
 * @typedef {Object} ReconnectInfo
 * @property {number} attempt        consecutive failed attempts so far (1 = the first retry since progress)
 * @property {number} delayMs        how long the client waits before this attempt
 * @property {string} reason         dropped | network | eof | idle | http-<status> | stream-error
 * @property {string} lastEventId    the position the client resumes after ("" = none yet: the run's beginning, or its tail)
 * @property {unknown} [error]       what went wrong, when something did
 */

/**
 * @typedef {Object} RunOutcome
 * @property {"finished" | "paused"} status  finished: `workflow_finished` arrived; paused: `workflow_paused`
 * @property {WorkflowEvent} event            that last event
 * @property {string} lastEventId             resume token of the last delivered event
 * @property {string | null} taskId
 * @property {string | null} workflowRunId
 * @property {number} reconnects              connections opened after the first one
 */

/**
 * @typedef {Object} CommonOptions
 * @property {string} [baseUrl]           the API's origin ("" = this page's origin)
 * @property {string} [apiKey]            service API: the app's API key (Bearer)
 * @property {string} [passport]          web app: a passport from GET /api/passport (Bearer) instead of apiKey
 * @property {string} [user]              service API: the end user (required there; the web app takes it from the passport)
 * @property {boolean} [continueOnPause]  keep following across pauses until `workflow_finished`
 * @property {boolean} [fromStart]       without a Last-Event-ID, (re)connect to the run's beginning
 *                                       (`include_state_snapshot=true`; the default) rather than its tail
 * @property {(event: WorkflowEvent, meta: EventMeta) => void} [onEvent]  every run event, exactly once, in order
 * @property {(info: ReconnectInfo) => void} [onReconnect]  before each reconnect
 * @property {(ids: {taskId: string, workflowRunId: string}) => void} [onRunCreated]
 * @property {(state: string) => void} [onStateChange]  connecting | open | reconnecting | finished | paused | failed | aborted
 * @property {AbortSignal} [signal]      aborts the whole run stream (`done` rejects with an AbortError)
 * @property {number} [maxRetries]       consecutive failed attempts (no event in between) before giving up; default 8
 * @property {number} [initialDelayMs]   first backoff delay unless the server sent `retry:`; default 250
 * @property {number} [maxDelayMs]       backoff cap; default 10000
 * @property {number} [idleTimeoutMs]    no byte for this long counts as a dropped connection; default 45000
 * @property {typeof fetch} [fetch]      the fetch to use (default globalThis.fetch)
 */

/** An HTTP answer that is not retried (400, 401, 404, 409, …); `body` is the server's JSON error. */
export class HttpError extends Error {
  /** @param {number} status @param {any} body */
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.name = "HttpError";
    /** @type {number} */ this.status = status;
    /** @type {string} */ this.code = (body && body.code) || `http_${status}`;
    /** @type {any} */ this.body = body;
  }
}
/** 400: a malformed request, or a Last-Event-ID the server refuses (code `invalid_resume_token`). */
export class BadRequestError extends HttpError { constructor(/** @type {number} */ s, /** @type {any} */ b) { super(s, b); this.name = "BadRequestError"; } }
/** 401: a missing or wrong API key or passport. */
export class UnauthorizedError extends HttpError { constructor(/** @type {number} */ s, /** @type {any} */ b) { super(s, b); this.name = "UnauthorizedError"; } }
/** 404: no such run for this app and user. */
export class NotFoundError extends HttpError { constructor(/** @type {number} */ s, /** @type {any} */ b) { super(s, b); this.name = "NotFoundError"; } }
/**
 * 410 `resume_cursor_expired` or `run_events_lost`: the events after the position are no longer
 * retained. `run` is the run row (`GET …/workflows/run/<id>`), so the outcome can still be shown.
 */
export class RunGoneError extends HttpError {
  /** @param {number} status @param {any} body @param {any} run */
  constructor(status, body, run) { super(status, body); this.name = "RunGoneError"; /** @type {any} */ this.run = run; }
}
/** The retry budget ran out; `cause` is the last failure. */
export class RetryBudgetExceededError extends Error {
  /** @param {number} attempts @param {unknown} cause */
  constructor(attempts, cause) {
    super(`gave up after ${attempts} failed attempts: ${cause instanceof Error ? cause.message : String(cause)}`);
    this.name = "RetryBudgetExceededError";
    /** @type {number} */ this.attempts = attempts;
    /** @type {unknown} */ this.cause = cause;
  }
}

/** @param {number} status @param {any} body @returns {HttpError} */
function httpError(status, body) {
  if (status === 400) return new BadRequestError(status, body);
  if (status === 401) return new UnauthorizedError(status, body);
  if (status === 404) return new NotFoundError(status, body);
  return new HttpError(status, body);
}

/**
 * The event-stream parser of the HTML standard (§9.2.6), fed bytes or text in chunks of any size:
 * UTF-8 with one leading BOM dropped, lines ended by CRLF, LF or CR (a CRLF split between chunks
 * is one line end), comments, `event:`, `data:` (lines joined with "\n"), `id:` (ignored if it
 * contains NUL; it persists to later messages), `retry:` (digits only). A message is dispatched at
 * its blank line; an unfinished message at the end of the stream is discarded, never half-delivered.
 */
export class SseParser {
  /**
   * @param {Object} handlers
   * @param {(message: SseMessage) => void} handlers.onMessage
   * @param {(ms: number) => void} [handlers.onRetry]
   * @param {string} [lastEventId]  the id a resumed stream starts from (ids persist across messages)
   */
  constructor({ onMessage, onRetry }, lastEventId = "") {
    this.onMessage = onMessage;
    this.onRetry = onRetry || (() => {});
    /** @type {string} */ this.lastEventId = lastEventId;
    // The BOM is dropped below, once, whether the stream comes as bytes or as text.
    this._decoder = new TextDecoder("utf-8", { ignoreBOM: true });
    this._started = false;
    this._line = "";
    this._skipLF = false;
    this._data = "";
    this._hasData = false;
    this._event = "";
    this._idBuffer = lastEventId;
    this._hasId = false;
  }

  /** @param {Uint8Array | string} chunk */
  push(chunk) {
    this._feed(typeof chunk === "string" ? chunk : this._decoder.decode(chunk, { stream: true }));
  }

  /** The stream ended: flush the decoder; an unfinished line or message is dropped. */
  end() {
    this._feed(this._decoder.decode());
    this._line = "";
    this._resetMessage();
  }

  /** @param {string} text */
  _feed(text) {
    if (!this._started && text.length > 0) {
      this._started = true;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    let start = 0;
    if (this._skipLF && text.length > 0) {
      if (text.charCodeAt(0) === 10) start = 1;
      this._skipLF = false;
    }
    for (let i = start; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      const line = this._line + text.slice(start, i);
      this._line = "";
      if (c === 13) {
        if (i + 1 < text.length) {
          if (text.charCodeAt(i + 1) === 10) i++;
        } else {
          this._skipLF = true; // a CR ends the chunk: an LF starting the next one belongs to it
        }
      }
      start = i + 1;
      this._processLine(line);
    }
    this._line += text.slice(start);
  }

  /** @param {string} line */
  _processLine(line) {
    if (line === "") return this._dispatch();
    if (line.charCodeAt(0) === 58) return; // ":" a comment
    const colon = line.indexOf(":");
    let field = line;
    let value = "";
    if (colon >= 0) {
      field = line.slice(0, colon);
      value = line.slice(colon + 1);
      if (value.charCodeAt(0) === 32) value = value.slice(1);
    }
    if (field === "event") {
      this._event = value;
    } else if (field === "data") {
      this._data += value + "\n";
      this._hasData = true;
    } else if (field === "id") {
      if (!value.includes("\u0000")) {
        this._idBuffer = value;
        this._hasId = true;
      }
    } else if (field === "retry") {
      if (/^[0-9]+$/.test(value)) this.onRetry(parseInt(value, 10));
    }
  }

  _dispatch() {
    this.lastEventId = this._idBuffer;
    if (!this._hasData) {
      this._resetMessage();
      return;
    }
    const message = {
      event: this._event || "message",
      data: this._data.slice(0, -1),
      lastEventId: this.lastEventId,
      hasId: this._hasId,
    };
    this._resetMessage();
    this.onMessage(message);
  }

  _resetMessage() {
    this._data = "";
    this._hasData = false;
    this._event = "";
    this._hasId = false;
    this._idBuffer = this.lastEventId;
  }
}

/**
 * Parse a whole event stream given as chunks (for tests and tools).
 * @param {Iterable<Uint8Array | string>} chunks
 * @returns {{messages: SseMessage[], retries: number[], lastEventId: string}}
 */
export function parseSse(chunks) {
  /** @type {SseMessage[]} */ const messages = [];
  /** @type {number[]} */ const retries = [];
  const parser = new SseParser({ onMessage: (m) => messages.push(m), onRetry: (ms) => retries.push(ms) });
  for (const chunk of chunks) parser.push(chunk);
  parser.end();
  return { messages, retries, lastEventId: parser.lastEventId };
}

/** Thrown inside the loop when one connection ends and the client should connect again. */
class Reconnect extends Error {
  /** @param {string} reason @param {unknown} [cause] @param {number} [retryAfterMs] */
  constructor(reason, cause, retryAfterMs = 0) {
    super(reason);
    this.reason = reason;
    this.cause = cause;
    this.retryAfterMs = retryAfterMs;
  }
}

/** @param {string} [message] */
function abortError(message = "the run stream was aborted") {
  return new DOMException(message, "AbortError");
}

/** @param {string | null} value @returns {number} milliseconds (0 when absent or unreadable) */
function retryAfterMs(value) {
  if (!value) return 0;
  if (/^\s*\d+\s*$/.test(value)) return parseInt(value, 10) * 1000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? 0 : Math.max(0, at - Date.now());
}

/** @param {Response} response */
async function jsonBody(response) {
  const text = await response.text().catch(() => "");
  try {
    return JSON.parse(text);
  } catch {
    return { message: text || `HTTP ${response.status}` };
  }
}

/** A fresh random Idempotency-Key (a UUID; randomUUID needs a secure context, getRandomValues does not). */
export function randomKey() {
  const crypto = globalThis.crypto;
  if (typeof crypto.randomUUID === "function") return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[6] = (bytes[6] & 0x0f) | 0x40;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/**
 * A run's event stream that resumes by itself. Create it with {@link streamRun} or {@link followRun}.
 */
export class RunStream {
  /**
   * @param {CommonOptions} options
   * @param {{body?: Object, idempotencyKey?: string, taskId?: string, workflowRunId?: string, lastEventId?: string}} start
   */
  constructor(options, start) {
    this.options = options;
    this._prefix = options.passport ? "/api" : "/v1";
    this._token = options.passport || options.apiKey || "";
    this._fetch = options.fetch || globalThis.fetch.bind(globalThis);
    /** @type {string | null} */ this.taskId = start.taskId || null;
    /** @type {string | null} */ this.workflowRunId = start.workflowRunId || null;
    this._lastEventId = start.lastEventId || "";
    this._startBody = start.body || null;
    /** The start's Idempotency-Key ("" = none: a POST that may have arrived is then never sent again). */
    this.idempotencyKey = start.idempotencyKey || "";
    this._posted = false; // the streaming POST got its 200: never send it again
    /** Whether the server answered the start for a run an earlier POST with the same key started. */
    this.replayed = false;
    this._retryMs = options.initialDelayMs ?? 250;
    /** Connections opened after the first. */
    this.reconnects = 0;
    /** @type {string} */ this.state = "connecting";
    /** @type {AbortController | null} */ this._connection = null;
    this._dropReason = "";
    this._outer = new AbortController();
    if (options.signal) {
      if (options.signal.aborted) this._outer.abort();
      else options.signal.addEventListener("abort", () => this.abort(), { once: true });
    }
    /** @type {Promise<RunOutcome>} */
    this.done = this._loop();
    // A caller that only uses the callbacks must not see an unhandled rejection.
    this.done.catch(() => {});
  }

  /** Resume token of the last event delivered: persist it to continue later with followRun. */
  get lastEventId() {
    return this._lastEventId;
  }

  /**
   * Cut the current connection as a network failure would; the stream resumes by itself. A start
   * without an Idempotency-Key is not cut before it is answered: it could not be sent again (false).
   * @returns {boolean} whether a connection was cut
   */
  drop(reason = "dropped") {
    if (!this._connection || (this._startBody !== null && !this._posted && !this.idempotencyKey)) return false;
    this._dropReason = reason;
    this._connection.abort();
    return true;
  }

  /** Stop for good; `done` rejects with an AbortError. */
  abort() {
    this._outer.abort();
    if (this._connection) this._connection.abort();
  }

  /** @param {string} state */
  _setState(state) {
    this.state = state;
    if (this.options.onStateChange) this.options.onStateChange(state);
  }

  _headers() {
    /** @type {Record<string, string>} */
    const headers = { Accept: "text/event-stream" };
    if (this._token) headers.Authorization = `Bearer ${this._token}`;
    return headers;
  }

  /** @param {string} path */
  _url(path) {
    return `${this.options.baseUrl || ""}${this._prefix}${path}`;
  }

  /** @returns {Promise<RunOutcome>} */
  async _loop() {
    let failures = 0;
    let connection = 0;
    for (;;) {
      if (this._outer.signal.aborted) {
        this._setState("aborted");
        throw abortError();
      }
      const controller = new AbortController();
      this._connection = controller;
      this._dropReason = "";
      let delivered = 0;
      try {
        const outcome = await this._connect(controller, connection, () => delivered++);
        this._setState(outcome.status);
        return outcome;
      } catch (error) {
        if (this._outer.signal.aborted) {
          this._setState("aborted");
          throw abortError();
        }
        if (!(error instanceof Reconnect)) {
          this._setState("failed");
          throw error;
        }
        failures = delivered > 0 ? 1 : failures + 1;
        const budget = this.options.maxRetries ?? 8;
        if (failures > budget) {
          this._setState("failed");
          throw new RetryBudgetExceededError(failures, error.cause || error.reason);
        }
        const cap = this.options.maxDelayMs ?? 10000;
        const backoff = Math.min(cap, this._retryMs * 2 ** (failures - 1));
        // A Retry-After is a floor, spread over up to half again as long: a herd told the same comes back spread.
        const delayMs = Math.round(Math.max(backoff * (0.5 + Math.random() / 2), error.retryAfterMs * (1 + Math.random() / 2)));
        this._setState("reconnecting");
        if (this.options.onReconnect) {
          this.options.onReconnect({
            attempt: failures, delayMs, reason: error.reason, lastEventId: this._lastEventId, error: error.cause,
          });
        }
        try {
          await this._sleep(delayMs);
        } catch (aborted) {
          this._setState("aborted");
          throw aborted;
        }
        connection++;
        this.reconnects++;
      } finally {
        this._connection = null;
      }
    }
  }

  /** @param {number} ms */
  _sleep(ms) {
    return new Promise((resolve, reject) => {
      const signal = this._outer.signal;
      if (signal.aborted) return reject(abortError());
      const timer = setTimeout(() => { signal.removeEventListener("abort", onAbort); resolve(undefined); }, ms);
      const onAbort = () => { clearTimeout(timer); reject(abortError()); };
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  /**
   * One connection: the streaming POST (when starting a run, until it is answered) or a GET of the events.
   * @param {AbortController} controller @param {number} index @param {() => void} progressed
   * @returns {Promise<RunOutcome>}
   */
  async _connect(controller, index, progressed) {
    const starting = this._startBody !== null && !this._posted;
    const runId = this.workflowRunId || this.taskId;
    if (!starting && !runId) throw new Error("the run's ids never arrived; it cannot be followed");
    // A connection that brings no answer within the idle time is as dead as one that stops sending.
    const waiting = setTimeout(() => { this._dropReason = "idle"; controller.abort(); }, this.options.idleTimeoutMs ?? 45000);
    /** @type {Response} */
    let response;
    try {
      if (starting) {
        /** @type {Record<string, string>} */
        const headers = { ...this._headers(), "Content-Type": "application/json" };
        if (this.idempotencyKey) headers["Idempotency-Key"] = this.idempotencyKey;
        response = await this._fetch(this._url("/workflows/run"), {
          method: "POST", headers, body: JSON.stringify(this._startBody), signal: controller.signal,
        });
      } else {
        response = await this._fetch(this._eventsUrl(String(runId)), {
          headers: this._eventsHeaders(), signal: controller.signal, cache: "no-store",
        });
      }
    } catch (error) {
      // Was the run created? Unknown: only its Idempotency-Key makes sending the POST again safe.
      if (starting && !this.idempotencyKey) throw error;
      throw new Reconnect(this._dropReason || "network", error);
    } finally {
      clearTimeout(waiting);
    }
    if (response.status !== 200) {
      const body = await jsonBody(response);
      const wait = retryAfterMs(response.headers.get("Retry-After"));
      // A refused streaming POST (503, 429) dispatched nothing, and one with an Idempotency-Key
      // returns the same run however often it is sent; a GET of the events can always be repeated.
      const retryable = response.status === 503 || response.status === 429
        || ((!starting || Boolean(this.idempotencyKey)) && response.status >= 500);
      if (retryable) throw new Reconnect(`http-${response.status}`, httpError(response.status, body), wait);
      if (response.status === 410) throw new RunGoneError(410, body, body.run || (await this._runRow()));
      throw httpError(response.status, body);
    }
    // The headers name the run before any event: a stream cut before its first event can resume.
    this.taskId = this.taskId || response.headers.get("X-Task-Id");
    this.workflowRunId = this.workflowRunId || response.headers.get("X-Workflow-Run-Id");
    if (starting) {
      this._posted = true;
      this.replayed = response.headers.get("Idempotent-Replayed") === "true";
      if (this.taskId && this.options.onRunCreated) {
        this.options.onRunCreated({ taskId: this.taskId, workflowRunId: String(this.workflowRunId) });
      }
    }
    this._setState("open");
    return this._read(response, controller, index, progressed);
  }

  /** @param {string} runId */
  _eventsUrl(runId) {
    const query = new URLSearchParams();
    if (!this.options.passport && this.options.user) query.set("user", this.options.user);
    if (this.options.continueOnPause) query.set("continue_on_pause", "true");
    // Without a position the server starts at the run's tail; from the beginning has to be asked for.
    if (!this._lastEventId && this.options.fromStart !== false) query.set("include_state_snapshot", "true");
    return this._url(`/workflow/${encodeURIComponent(runId)}/events?${query}`);
  }

  _eventsHeaders() {
    const headers = this._headers();
    if (this._lastEventId) headers["Last-Event-ID"] = this._lastEventId;
    return headers;
  }

  /**
   * @param {Response} response @param {AbortController} controller @param {number} index
   * @param {() => void} progressed
   * @returns {Promise<RunOutcome>}
   */
  async _read(response, controller, index, progressed) {
    if (!response.body) throw new Reconnect("eof");
    const reader = response.body.getReader();
    /** @type {RunOutcome | null} */
    let outcome = null;
    /** @type {Error | null} */
    let failure = null;
    const parser = new SseParser(
      {
        onMessage: (message) => {
          if (outcome || failure) return; // nothing after the end is delivered
          const result = this._handle(message, index, progressed);
          if (result instanceof Error) failure = result;
          else if (result) outcome = result;
        },
        onRetry: (ms) => { this._retryMs = ms; },
      },
      this._lastEventId,
    );
    const idleMs = this.options.idleTimeoutMs ?? 45000;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let idle;
    const armIdle = () => {
      clearTimeout(idle);
      idle = setTimeout(() => { this._dropReason = "idle"; controller.abort(); }, idleMs);
    };
    try {
      armIdle();
      for (;;) {
        let chunk;
        try {
          chunk = await reader.read();
        } catch (error) {
          throw new Reconnect(this._dropReason || "network", error);
        }
        if (chunk.done) break;
        armIdle();
        parser.push(chunk.value);
        if (failure) throw await this._withRunRow(failure);
        if (outcome) return outcome;
      }
      parser.end();
      if (failure) throw await this._withRunRow(failure);
      if (outcome) return outcome;
      throw new Reconnect("eof");
    } finally {
      clearTimeout(idle);
      reader.cancel().catch(() => {});
    }
  }

  /**
   * One parsed message: deliver a run event, note the ids, or turn `event: error` into an outcome.
   * @param {SseMessage} message @param {number} index @param {() => void} progressed
   * @returns {RunOutcome | Error | null}
   */
  _handle(message, index, progressed) {
    // Ids persist between messages: a message's lastEventId is the position right after it.
    if (message.lastEventId && message.event !== "error") this._lastEventId = message.lastEventId;
    if (message.event === "ping") return null;
    if (message.event === "error") {
      const body = JSON.parse(message.data);
      const status = Number(body.status) || 500;
      if (status === 410) return new RunGoneError(410, body, body.run || null);
      if (status >= 500 || status === 429) return new Reconnect("stream-error", httpError(status, body));
      return httpError(status, body);
    }
    if (message.event !== "message") return null; // a notice (an older server's run_created, a newer one's)
    /** @type {WorkflowEvent} */
    const event = JSON.parse(message.data);
    if (!this.workflowRunId && event.workflow_run_id) this.workflowRunId = event.workflow_run_id;
    if (!this.taskId && event.task_id) this.taskId = event.task_id;
    progressed();
    if (this.options.onEvent) this.options.onEvent(event, { id: message.hasId ? message.lastEventId : "", connection: index });
    const finished = event.event === "workflow_finished";
    if (finished || (event.event === "workflow_paused" && !this.options.continueOnPause)) {
      return {
        status: finished ? "finished" : "paused",
        event,
        lastEventId: this._lastEventId,
        taskId: this.taskId,
        workflowRunId: this.workflowRunId,
        reconnects: this.reconnects,
      };
    }
    return null;
  }

  /** @param {Error} failure @returns {Promise<Error>} a RunGoneError completed with the run row */
  async _withRunRow(failure) {
    if (failure instanceof RunGoneError && !failure.run) failure.run = await this._runRow();
    return failure;
  }

  /** The run row, for a 410 whose body did not carry it. */
  async _runRow() {
    if (!this.workflowRunId || this.options.passport) return null;
    try {
      return await getRun({ ...this.options, workflowRunId: this.workflowRunId });
    } catch {
      return null;
    }
  }
}

/**
 * Start a run (`POST …/workflows/run`, streaming) and follow its events to the end (or the pause).
 * `idempotencyKey`: a key of your own, `false` for none; by default a fresh random one, so that a POST
 * cut before its answer is sent again (same key, same run) within the retry budget.
 * @param {CommonOptions & {inputs: Object, idempotencyKey?: string | false}} options
 * @returns {RunStream}
 */
export function streamRun(options) {
  /** @type {Record<string, unknown>} */
  const body = { inputs: options.inputs || {}, response_mode: "streaming" };
  if (!options.passport) body.user = options.user;
  const key = options.idempotencyKey === false ? "" : options.idempotencyKey || randomKey();
  return new RunStream(options, { body, idempotencyKey: key });
}

/**
 * Follow an existing run's events (`GET …/workflow/<id>/events`, by its workflowRunId or its taskId):
 * strictly after `lastEventId` when given (a token persisted from `RunStream.lastEventId`), else from
 * the run's beginning (or, with `fromStart: false`, from what happens next).
 * @param {CommonOptions & {taskId?: string, workflowRunId?: string, lastEventId?: string}} options
 * @returns {RunStream}
 */
export function followRun(options) {
  return new RunStream(options, {
    taskId: options.taskId, workflowRunId: options.workflowRunId, lastEventId: options.lastEventId,
  });
}

/**
 * @param {CommonOptions} options @param {string} method @param {string} path @param {Object} [body]
 * @returns {Promise<any>}
 */
async function request(options, method, path, body) {
  const prefix = options.passport ? "/api" : "/v1";
  /** @type {Record<string, string>} */
  const headers = { Authorization: `Bearer ${options.passport || options.apiKey || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const doFetch = options.fetch || globalThis.fetch.bind(globalThis);
  const response = await doFetch(`${options.baseUrl || ""}${prefix}${path}`, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal: options.signal,
  });
  const json = await jsonBody(response);
  if (!response.ok) throw response.status === 410 ? new RunGoneError(410, json, json.run || null) : httpError(response.status, json);
  return json;
}

/**
 * The run row (`GET /v1/workflows/run/<id>?user=…`).
 * @param {CommonOptions & {workflowRunId: string}} options
 */
export function getRun(options) {
  const query = new URLSearchParams({ user: options.user || "" });
  return request(options, "GET", `/workflows/run/${encodeURIComponent(options.workflowRunId)}?${query}`);
}

/**
 * A human-input form (`GET …/form/human_input/<formToken>`; the token comes with `human_input_required`
 * and each reason of `workflow_paused`): `{form_content, inputs, resolved_default_values, user_actions,
 * expiration_time}`.
 * @param {CommonOptions & {formToken: string}} options
 */
export function getForm(options) {
  return request(options, "GET", `/form/human_input/${encodeURIComponent(options.formToken)}`);
}

/**
 * Submit a human-input form (`POST …/form/human_input/<formToken>`) with the action (button) `action`,
 * by default the form's first (read with {@link getForm} first). The run goes on; follow it again with
 * {@link followRun} from the last event id to see it continue. 412 when the form was already
 * submitted (`human_input_form_submitted`) or expired (`human_input_form_expired`).
 * @param {CommonOptions & {formToken: string, inputs: Object, action?: string}} options
 */
export async function submitForm(options) {
  let action = options.action;
  if (!action) {
    const actions = (await getForm(options)).user_actions || [];
    if (!actions.length) throw new Error("the form has no actions to submit it with");
    action = actions[0].id;
  }
  /** @type {Record<string, unknown>} */
  const body = { inputs: options.inputs, action };
  if (!options.passport) body.user = options.user;
  return request(options, "POST", `/form/human_input/${encodeURIComponent(options.formToken)}`, body);
}

/**
 * Submit a paused run's open form by the run's id (`POST /v1/workflows/runs/<id>/human-input`, this
 * API's own route; {@link submitForm} is Dify's).
 * @param {CommonOptions & {workflowRunId: string, inputs: Object, action?: string}} options
 */
export function submitHumanInput(options) {
  return request(options, "POST", `/workflows/runs/${encodeURIComponent(options.workflowRunId)}/human-input`, {
    user: options.user, inputs: options.inputs, ...(options.action ? { action: options.action } : {}),
  });
}

/**
 * Stop a running or paused run (`POST …/workflows/tasks/<taskId>/stop`).
 * @param {CommonOptions & {taskId: string}} options
 */
export function stopRun(options) {
  return request(options, "POST", `/workflows/tasks/${encodeURIComponent(options.taskId)}/stop`, options.passport ? {} : { user: options.user });
}

/**
 * A web-app passport for the app with this site code (`GET /api/passport`).
 * @param {{baseUrl?: string, siteCode: string, fetch?: typeof fetch}} options
 * @returns {Promise<{access_token: string, end_user: string}>}
 */
export async function fetchPassport(options) {
  const doFetch = options.fetch || globalThis.fetch.bind(globalThis);
  const response = await doFetch(`${options.baseUrl || ""}/api/passport`, { headers: { "X-App-Code": options.siteCode } });
  const json = await jsonBody(response);
  if (!response.ok) throw httpError(response.status, json);
  return json;
}
