"""The Durable Streams HTTP protocol over the durable-stream library (the gateway's logic).

:mod:`.streams` loads and deletes streams and keeps their metadata (:mod:`.metadata`) current;
:mod:`.creating` creates and forks them; :mod:`.writing` appends and closes; :mod:`.reading` reads
records by ordinal; :mod:`.live` produces long-poll and SSE answers; :mod:`.offsets`,
:mod:`.json_mode` and :mod:`.framing` are the protocol's encodings and the records' own; :mod:`.access`
decides who may do what. The HTTP layer is ``api.controllers.durable_streams``; docs/conformance.md
explains the design.
"""
