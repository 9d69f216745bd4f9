// The Durable Streams server conformance suite against the gateway at DURABLE_STREAMS_BASE_URL
// (started by tests/conformance/gateway.py; run by test_conformance.py and `make test-conformance`).
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

// Node's fetch reports every network error as "fetch failed": name its cause in the failure message.
const nodeFetch = globalThis.fetch
globalThis.fetch = async (...args) => {
  try {
    return await nodeFetch(...args)
  } catch (error) {
    if (error?.cause) {
      error.message += ` (${error.cause.code ?? ""} ${error.cause.message ?? error.cause})`
    }
    throw error
  }
}

const baseUrl = process.env.DURABLE_STREAMS_BASE_URL
if (!baseUrl) {
  throw new Error("DURABLE_STREAMS_BASE_URL is not set")
}

runConformanceTests({
  baseUrl,
  longPollTimeoutMs: Number(process.env.DURABLE_STREAMS_LONG_POLL_MS ?? 20000),
})
