// Reads one Durable Streams stream (a workflow run through the gateway) with @durable-streams/client,
// exactly as an application would, and prints what happened as JSON lines on stdout:
//
//   {"type":"session","session":0,"offset":"-1"}       a stream() session starts from this offset
//   {"type":"request","url":"..."}                      every HTTP request the client makes
//   {"type":"batch","items":[...],"offset":"...",...}   every batch the client delivers, in order
//   {"type":"error","message":"..."}                    a session ended with an error (a cut connection)
//   {"type":"interrupted","offset":"..."}               a session ended before it delivered the end
//   {"type":"end","offset":"..."}                       a batch said the stream is closed (Stream-Closed)
//
// A session that ends early (an error, or the body of a cut connection ending) is followed by a new
// one from the last offset the client delivered, as the client's documentation says to resume.
//
// Usage: node read_run.mjs <url> <api key> <live mode: sse | long-poll> [max sessions]

import { stream } from "@durable-streams/client"

const [url, apiKey, live = "sse", maxSessionsText = "10"] = process.argv.slice(2)
if (!url || !apiKey) {
  process.stderr.write("usage: node read_run.mjs <url> <api key> [sse|long-poll] [max sessions]\n")
  process.exit(2)
}
const maxSessions = Number(maxSessionsText)

const print = (line) => process.stdout.write(JSON.stringify(line) + "\n")

const loggedFetch = (input, init) => {
  print({ type: "request", url: String(input instanceof Request ? input.url : input) })
  return fetch(input, init)
}

const delay = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
// A session's `closed` can resolve while its last response is still on its way to the subscriber
// (the client closes a long-poll session as soon as it has fetched the closing response): wait this
// long for that batch before giving the session up and resuming in a new one.
const DRAIN_MS = 2000

let offset = "-1"
for (let session = 0; session < maxSessions; session++) {
  print({ type: "session", session, offset })
  // Once a session is given up its late batches are ignored: the next one resumes after the last
  // batch delivered here, so nothing is delivered twice.
  let active = true
  let ended = false
  let sawEnd = () => {}
  const endSeen = new Promise((resolve) => {
    sawEnd = resolve
  })
  let response
  let failed = false
  try {
    response = await stream({
      url,
      headers: { Authorization: `Bearer ${apiKey}` },
      offset,
      live,
      fetch: loggedFetch,
      backoffOptions: { initialDelay: 50, maxDelay: 500, multiplier: 2, maxRetries: 20 },
      sseResilience: { logWarnings: false },
    })
    response.subscribeJson((batch) => {
      if (!active) return
      print({
        type: "batch",
        session,
        items: batch.items,
        offset: batch.offset,
        upToDate: batch.upToDate,
        streamClosed: batch.streamClosed,
      })
      offset = batch.offset
      if (batch.streamClosed) {
        ended = true
        sawEnd()
      }
    })
    await Promise.race([endSeen, response.closed])
    if (!ended) await Promise.race([endSeen, delay(DRAIN_MS)])
  } catch (error) {
    failed = true
    const cause = error?.cause?.code ?? error?.cause?.message ?? ""
    print({ type: "error", session, message: String(error?.message ?? error), cause: String(cause) })
  } finally {
    active = false
    response?.cancel()
  }
  if (ended) {
    print({ type: "end", offset })
    process.exit(0)
  }
  if (!failed) print({ type: "interrupted", session, offset, streamClosed: Boolean(response?.streamClosed) })
}
print({ type: "gave-up", offset })
process.exit(1)
