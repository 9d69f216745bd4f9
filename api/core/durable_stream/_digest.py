"""The digest chain that makes a position name the history before it, not only its ordinal.

Each record of a topic carries a short digest computed by the store when the record is appended:
the hash of its predecessor's digest followed by its own payload (the first record of an incarnation
follows the empty digest). Equal digests at one ordinal therefore mean equal histories up to that
ordinal (64 bits: a collision is not a practical concern), and a cursor that carries its record's
digest lets one comparison at resume prove that the reader and the store share the whole prefix:
after a store failover that lost the last appends, a promoted replica that took other records at
those ordinals no longer matches, and the reader is told (``history_diverged``) instead of being
handed another history as the continuation of its own.

A digest is 16 lowercase hexadecimal characters; ``""`` means "unknown" (a record written before
digests existed, a cursor of the previous version, an ordinal-only position) and is never compared.
The hash is the adapter's (:attr:`~._driver.Driver.chain`), whatever its store can compute inside an
append: SHA-1 (Redis' Lua has nothing else), SHA-256 on PostgreSQL. The content decides the digest,
so a producer that re-appends exactly the records a store lost restores the very same chain.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["DIGEST_LENGTH", "GENESIS", "is_digest", "sha1_chain", "sha256_chain"]

#: Hexadecimal characters of a digest (64 bits).
DIGEST_LENGTH = 16
#: The digest of the position before an incarnation's first record.
GENESIS = ""

_DIGEST = re.compile(r"[0-9a-f]{16}")


def sha1_chain(previous: str, payload: bytes) -> str:
    """The digest of a record with ``payload`` after the record whose digest is ``previous``."""
    return hashlib.sha1(previous.encode("ascii") + payload, usedforsecurity=False).hexdigest()[:DIGEST_LENGTH]


def sha256_chain(previous: str, payload: bytes) -> str:
    """As :func:`sha1_chain`, with SHA-256 (what PostgreSQL computes without an extension)."""
    return hashlib.sha256(previous.encode("ascii") + payload).hexdigest()[:DIGEST_LENGTH]


def is_digest(value: object) -> bool:
    """Whether ``value`` is a digest (``""``, unknown, is not)."""
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None
