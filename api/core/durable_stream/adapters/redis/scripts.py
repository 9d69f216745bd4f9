"""Server-side Lua scripts of the Redis adapter, and the keys they work on.

Every operation that reads or changes a topic is one script, so Redis runs it atomically: the
ordinal, the record, the trim, the TTL and the wake-up message of an append happen together, and a
read's records and head come from one snapshot.

Keys of one topic (all share one hash tag, so the topic lives in one cluster slot):

- ``KEYS[1]`` the metadata hash: ``e`` epoch, ``l`` last ordinal, ``i`` stream ID of the last record
  (the stream's ``last-generated-id``: it is written from ``XADD``'s reply in the same script, and,
  unlike ``XREVRANGE``, it survives a trim to empty), ``h`` the last record's digest, ``s`` = ``1``
  once sealed.
- ``KEYS[2]`` the stream: one entry per record with fields ``o`` (ordinal), ``p`` (payload) and ``h``
  (digest: the first 16 hexadecimal characters of ``SHA1(previous digest .. payload)``, see
  ``_digest``; entries written before digests existed have none).
  Entries are only ever removed from the front by ``XTRIM``/``MAXLEN``/``MINID``; never ``XDEL``.
- ``KEYS[3]`` a sharded pub/sub channel, not a key: the wake-up and prefetch hints the shared
  reader listens to (``SPUBLISH``; published messages are not written to the AOF).

The first retained ordinal is not stored: the stream holds exactly the records first..last, so it
is ``last - XLEN + 1`` and cannot drift from what ``XTRIM`` really removed.

Hint messages (``|``-separated, the payload last so it may contain anything):

- ``A|epoch|ordinal|id|previous id|first|digest|payload``: a record was appended (payload included
  when small enough), ``N|epoch|ordinal|id|previous id|first|digest`` the same without the payload.
  The first record's previous id is ``e:<epoch>``; ``first`` is 0 when the append cannot have moved it;
- ``S|epoch|last|last id|last digest``: the topic is sealed; ``t|first``: records were trimmed;
  ``d``: deleted.

(Upper-case kinds since digests: a process of the previous release treats them as unknown hints, which
only make it forget what it prefetched, and this one treats the old ``a``, ``n`` and ``s`` the same way.)

Keys must only be changed through these scripts (or deleted together): a stream key deleted by hand
under surviving metadata would let the next ``XADD`` restart its IDs, which readers report as an
error rather than repair.
"""

from __future__ import annotations

import dataclasses
import hashlib

__all__ = [
    "APPEND",
    "APPEND_SCRIPT",
    "DELETE",
    "DELETE_SCRIPT",
    "HEAD",
    "HEAD_SCRIPT",
    "INFO",
    "INFO_SCRIPT",
    "READ",
    "READ_SCRIPT",
    "RETAIN",
    "RETAIN_SCRIPT",
    "SEAL",
    "SEAL_SCRIPT",
    "TRIM",
    "TRIM_SCRIPT",
    "Script",
    "topic_keys",
]


def topic_keys(prefix: str, topic: str) -> tuple[bytes, bytes, bytes]:
    """``KEYS[1..3]`` of ``topic``: the metadata hash, the stream and the hint channel.

    All three share the hash tag ``{<prefix><topic>}``; a topic name containing ``{``/``}`` or
    starting with ``#`` uses a digest of the name as the tag instead.
    """
    if "{" in topic or "}" in topic or topic.startswith("#"):
        digest = hashlib.blake2b(topic.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        tag = f"{prefix}#{digest}"
    else:
        tag = prefix + topic
    base = b"{" + tag.encode("utf-8", "surrogatepass") + b"}:"
    return base + b"m", base + b"s", base + b"n"


# Shared helpers, prepended to each script.
_COMMON = r"""
local function ordinal_of(entry)
  local fields = entry[2]
  for index = 1, #fields, 2 do
    if fields[index] == 'o' then return tonumber(fields[index + 1]) end
  end
  return redis.error_reply('stream entry without an ordinal')
end

-- The stream holds exactly the records first..last (ordinals are dense and only a prefix is ever
-- removed), so its length gives the first retained ordinal in O(1).
local function first_ordinal(stream, last)
  return last - redis.call('XLEN', stream) + 1
end

local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- A new incarnation: a stream left behind by an earlier one (its metadata expired first) must not
-- mix its ordinals into the new one.
local function create(meta, stream, epoch)
  redis.call('DEL', stream)
  redis.call('HSET', meta, 'e', epoch, 'l', 0)
end

local function refresh_ttl(meta, stream, max_age)
  if max_age > 0 then
    redis.call('PEXPIRE', meta, max_age)
    redis.call('PEXPIRE', stream, max_age)
  end
end

local function trim_by_age(stream, max_age)
  if max_age <= 0 then return 0 end
  return redis.call('XTRIM', stream, 'MINID', '=', string.format('%.0f-0', now_ms() - max_age))
end
"""

#: ARGV: payload, epoch for a new topic, max_records (0: none), max_age_ms (0: none), include the
#: payload in the hint (1/0), expected last ordinal and expected last digest (both '': append whatever
#: the head). Returns ``{1, epoch, ordinal, id, first, previous id, digest}`` (``first`` is 0 when no
#: option trims on append), ``{0}`` when the topic is sealed, or, when the head is not the expected
#: one (nothing stored), ``{2}`` for a missing topic and ``{2, epoch, first, last, sealed, last id,
#: last digest}`` otherwise.
APPEND = r"""
-- The hot path: no shared helpers (defining them costs more than the rest of the script).
local meta, stream, channel = KEYS[1], KEYS[2], KEYS[3]
local state = redis.call('HMGET', meta, 'e', 'l', 'i', 's', 'h')
local epoch, previous, last_digest = state[1], state[3], state[5] or ''
if ARGV[6] ~= '' then
  local last = tonumber(state[2] or '0')
  if not epoch then
    if ARGV[6] ~= '0' then return {2} end
  elseif last ~= tonumber(ARGV[6]) or last_digest ~= ARGV[7] then
    return {2, epoch, last - redis.call('XLEN', stream) + 1, last, state[4] and 1 or 0, previous or '', last_digest}
  end
end
if not epoch then
  -- A new incarnation: a stream left behind by an earlier one must not mix its ordinals in.
  epoch, previous, last_digest = ARGV[2], false, ''
  redis.call('DEL', stream)
elseif state[4] then
  return {0}
end
local ordinal = tonumber(state[2] or '0') + 1
local digest = string.sub(redis.sha1hex(last_digest .. ARGV[1]), 1, 16)
local max_records, max_age = tonumber(ARGV[3]), tonumber(ARGV[4])
local id
if max_records > 0 then
  id = redis.call('XADD', stream, 'MAXLEN', '=', max_records, '*', 'o', ordinal, 'p', ARGV[1], 'h', digest)
else
  id = redis.call('XADD', stream, '*', 'o', ordinal, 'p', ARGV[1], 'h', digest)
end
redis.call('HSET', meta, 'e', epoch, 'l', ordinal, 'i', id, 'h', digest)
-- Without trimming options an append never moves the first record: 0 says "unchanged".
local first = 0
if max_age > 0 then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  redis.call('XTRIM', stream, 'MINID', '=', string.format('%.0f-0', now_ms - max_age))
  redis.call('PEXPIRE', meta, max_age)
  redis.call('PEXPIRE', stream, max_age)
end
if max_records > 0 or max_age > 0 then first = ordinal - redis.call('XLEN', stream) + 1 end
-- The first record of an incarnation follows the pseudo position 'e:<epoch>' (see the driver).
previous = previous or ('e:' .. epoch)
local header = epoch .. '|' .. ordinal .. '|' .. id .. '|' .. previous .. '|' .. first .. '|' .. digest
if ARGV[5] == '1' then
  redis.call('SPUBLISH', channel, 'A|' .. header .. '|' .. ARGV[1])
else
  redis.call('SPUBLISH', channel, 'N|' .. header)
end
return {1, epoch, ordinal, id, first, previous, digest}
"""

#: ARGV: epoch for a new topic, max_age_ms. Returns the head like HEAD.
SEAL = (
    _COMMON
    + r"""
local meta, stream, channel = KEYS[1], KEYS[2], KEYS[3]
if redis.call('HSETNX', meta, 'e', ARGV[1]) == 1 then create(meta, stream, ARGV[1]) end
redis.call('HSET', meta, 's', 1)
refresh_ttl(meta, stream, tonumber(ARGV[2]))
local state = redis.call('HMGET', meta, 'e', 'l', 'i', 'h')
local last = tonumber(state[2])
redis.call('SPUBLISH', channel, 'S|' .. state[1] .. '|' .. last .. '|' .. (state[3] or '') .. '|' .. (state[4] or ''))
return {state[1], first_ordinal(stream, last), last, 1, state[3] or '', state[4] or ''}
"""
)

#: ARGV: create (1/0), epoch for a new topic, max_age_ms. Returns
#: ``{epoch, first, last, sealed, last id, last digest}`` or ``{}`` when the topic does not exist.
HEAD = (
    _COMMON
    + r"""
local meta, stream = KEYS[1], KEYS[2]
if ARGV[1] == '1' and redis.call('HSETNX', meta, 'e', ARGV[2]) == 1 then
  create(meta, stream, ARGV[2])
  refresh_ttl(meta, stream, tonumber(ARGV[3]))
end
local state = redis.call('HMGET', meta, 'e', 'l', 'i', 's', 'h')
if not state[1] then return {} end
local last = tonumber(state[2])
return {state[1], first_ordinal(stream, last), last, state[4] and 1 or 0, state[3] or '', state[5] or ''}
"""
)

#: ARGV: after ordinal, after stream ID ('' when unknown), limit. Returns the head as in HEAD
#: followed by the records (``XRANGE`` entries), or ``{}`` when the topic does not exist.
READ = (
    _COMMON
    + r"""
local meta, stream = KEYS[1], KEYS[2]
local state = redis.call('HMGET', meta, 'e', 'l', 'i', 's', 'h')
if not state[1] then return {} end
local last = tonumber(state[2])
local after, native, limit = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local first = first_ordinal(stream, last)
local records = {}
local target = after + 1
if target <= last and target >= first and native ~= '' then
  records = redis.call('XRANGE', stream, '(' .. native, '+', 'COUNT', limit)
  -- The stream ID of another history (records re-appended after a failover have new IDs): the
  -- ordinal is found below instead, and the reader compares the digests.
  if #records == 0 or ordinal_of(records[1]) ~= target then native, records = '', {} end
end
if target <= last and target >= first and native == '' then
  if target == first then
    records = redis.call('XRANGE', stream, '-', '+', 'COUNT', limit)
  else
    -- No stream ID to start from: find the millisecond holding the target ordinal by bisection
    -- over the entry IDs (ordinals grow with IDs), then skip the entries before it in that
    -- millisecond. O(log(time span)) range probes instead of a scan from the first entry.
    local oldest = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)
    local newest = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
    local low = tonumber(string.match(oldest[1][1], '^(%d+)'))
    local high = tonumber(string.match(newest[1][1], '^(%d+)'))
    while low < high do
      local middle = low + math.floor((high - low + 1) / 2)
      local probe = redis.call('XRANGE', stream, string.format('%.0f-0', middle), '+', 'COUNT', 1)
      if #probe > 0 and ordinal_of(probe[1]) <= target then low = middle else high = middle - 1 end
    end
    local start = string.format('%.0f-0', low)
    local probe = redis.call('XRANGE', stream, start, '+', 'COUNT', 1)
    local skip = target - ordinal_of(probe[1])
    local found = redis.call('XRANGE', stream, start, '+', 'COUNT', skip + limit)
    for index = skip + 1, #found do records[#records + 1] = found[index] end
  end
end
return {state[1], first, last, state[4] and 1 or 0, state[3] or '', state[5] or '', records}
"""
)

#: Returns ``{}`` or ``{length, first, last, sealed, epoch, last digest}``.
INFO = (
    _COMMON
    + r"""
local meta, stream = KEYS[1], KEYS[2]
local state = redis.call('HMGET', meta, 'e', 'l', 's', 'h')
if not state[1] then return {} end
local last = tonumber(state[2])
return {redis.call('XLEN', stream), first_ordinal(stream, last), last, state[3] and 1 or 0, state[1], state[4] or ''}
"""
)

#: ARGV: keep_last. Returns ``{removed, first}``: how many records were removed, the first one left.
TRIM = (
    _COMMON
    + r"""
local meta, stream, channel = KEYS[1], KEYS[2], KEYS[3]
local removed = redis.call('XTRIM', stream, 'MAXLEN', '=', tonumber(ARGV[1]))
local first = first_ordinal(stream, tonumber(redis.call('HGET', meta, 'l') or '0'))
if removed > 0 then redis.call('SPUBLISH', channel, 't|' .. first) end
return {removed, first}
"""
)

#: ARGV: max_records (0: none), max_age_ms (0: none). Returns ``{removed, first}`` as TRIM does.
RETAIN = (
    _COMMON
    + r"""
local meta, stream, channel = KEYS[1], KEYS[2], KEYS[3]
local removed = 0
local max_records, max_age = tonumber(ARGV[1]), tonumber(ARGV[2])
if max_records > 0 then removed = removed + redis.call('XTRIM', stream, 'MAXLEN', '=', max_records) end
removed = removed + trim_by_age(stream, max_age)
local first = first_ordinal(stream, tonumber(redis.call('HGET', meta, 'l') or '0'))
if removed > 0 then redis.call('SPUBLISH', channel, 't|' .. first) end
return {removed, first}
"""
)

#: Returns 1 when the topic existed.
DELETE = r"""
local existed = redis.call('EXISTS', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SPUBLISH', KEYS[3], 'd')
return existed
"""


@dataclasses.dataclass(frozen=True, slots=True)
class Script:
    """A script's source and the SHA1 that ``EVALSHA`` names it by."""

    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> Script:
        return cls(source, hashlib.sha1(source.encode()).hexdigest())


APPEND_SCRIPT = Script.of(APPEND)
SEAL_SCRIPT = Script.of(SEAL)
HEAD_SCRIPT = Script.of(HEAD)
READ_SCRIPT = Script.of(READ)
INFO_SCRIPT = Script.of(INFO)
TRIM_SCRIPT = Script.of(TRIM)
RETAIN_SCRIPT = Script.of(RETAIN)
DELETE_SCRIPT = Script.of(DELETE)
