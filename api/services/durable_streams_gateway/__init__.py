"""The Durable Streams HTTP protocol over the durable-stream library (the gateway's logic).

:mod:`.streams` loads, creates, forks and deletes streams; :mod:`.writing` appends and closes;
:mod:`.reading` reads records by ordinal; :mod:`.live` produces long-poll and SSE answers;
:mod:`.offsets` and :mod:`.json_mode` are the protocol's encodings; :mod:`.access` decides who may do
what. The HTTP layer is ``api.controllers.durable_streams``; docs/conformance.md explains the design.
"""
