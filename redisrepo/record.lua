-- record.lua is the prelude of the scripts that read records of either
-- format: legacy.lua, replace.lua and inspect.lua. Go prepends it to their
-- bodies. scripts.go writes, before it, the constants that Go and Lua share,
-- from their Go values (record.go): VERSION, the legacy format version "1";
-- VERSION2, the first byte of a format 2 record; the state codes of the
-- replies, ABSENT, PENDING, COMPLETED, UNREADABLE and NOT_REPLAYABLE
-- (PENDING, COMPLETED and NOT_REPLAYABLE are also the state bytes of format
-- 2); and FLAG_WAITERS, FLAG_TOKEN_HEX
-- and FLAG_FP_HEX, the flag bits of format 2.
--
-- Format 2, which Go writes, is one STRING (record.go describes it byte by
-- byte). Format 1, which this package no longer writes but still reads, is
-- a HASH under one key:
--   v           format version, "1"
--   state       "pending", "completed" or "not_replayable"
--   token       owner token of the reservation
--   fp          request fingerprint, "" for none
--   result      encoded result (completed), the reason (not_replayable)
--   created_ms  Redis server time of the write, Unix milliseconds
-- Readers ignore fields they do not know. Anything else under the key
-- (another Redis type, a missing field, an unknown state or version) is
-- unreadable.

-- keytype returns the Redis type of key as a string ("none" when absent).
local function keytype(key)
  local t = redis.call('TYPE', key)
  if type(t) == 'table' then
    return t.ok
  end
  return t
end

-- NOTHING is what load returns for an absent or unreadable record: the
-- fields of no record. It is shared: never change it.
local NOTHING = {token = '', fp = '', created_ms = '', result = '', size = 0, flags = 0}

-- flag reports whether bit (a power of two) is set in flags.
local function flag(flags, bit)
  return math.floor(flags / bit) % 2 == 1
end

-- parse2 reads v, the STRING under a record's key, as a format 2 record. It
-- returns the state and a table of the fields as load returns them, except
-- that token and fp are as stored (packed when their flag is set).
local function parse2(v)
  if #v < 6 or string.byte(v, 1) ~= VERSION2 then
    return UNREADABLE, NOTHING
  end
  local st, flags, tl = string.byte(v, 2, 4)
  local fl = string.byte(v, 5) * 256 + string.byte(v, 6)
  local e = 6 + tl + fl
  if #v < e or (st ~= PENDING and st ~= COMPLETED and st ~= NOT_REPLAYABLE) or (st == PENDING and #v ~= e) then
    return UNREADABLE, NOTHING
  end
  local r = {token = string.sub(v, 7, 6 + tl), fp = string.sub(v, 7 + tl, e), created_ms = '',
    result = string.sub(v, e + 1), size = #v - e, flags = flags}
  return st, r
end

-- hex returns the lowercase hex digits of the bytes of s.
local function hex(s)
  return (string.gsub(s, '.', function(c) return string.format('%02x', string.byte(c)) end))
end

-- load reads the record at key, of either format: the one reader of the
-- formats in Lua. It returns the record's state and a table of its fields:
--   token, fp    the owner token and the request fingerprint, as given
--   created_ms   the time of the write, "" when the record has none
--   size         the length of the result (or reason) in bytes, 0 for a
--                pending record
--   result       the result (or reason), "" for a pending record and unless
--                withresult
-- With withresult false it does not read the result of a format 1 record,
-- which may be large: only whether it is there, and its size. An absent or
-- unreadable record has the table NOTHING.
local function load(key, withresult)
  local t = keytype(key)
  if t == 'none' then
    return ABSENT, NOTHING
  end
  if t == 'string' then
    local st, r = parse2(redis.call('GET', key))
    if st ~= UNREADABLE then
      if flag(r.flags, FLAG_TOKEN_HEX) then
        r.token = hex(r.token)
      end
      if flag(r.flags, FLAG_FP_HEX) then
        r.fp = hex(r.fp)
      end
      if not withresult then
        r.result = ''
      end
    end
    return st, r
  end
  if t ~= 'hash' then
    return UNREADABLE, NOTHING
  end
  local f
  if withresult then
    f = redis.call('HMGET', key, 'v', 'state', 'token', 'fp', 'created_ms', 'result')
  else
    f = redis.call('HMGET', key, 'v', 'state', 'token', 'fp', 'created_ms')
  end
  if f[1] ~= VERSION or not f[3] or not f[4] then
    return UNREADABLE, NOTHING
  end
  local r = {token = f[3], fp = f[4], created_ms = f[5] or '', result = '', size = 0, flags = 0}
  if f[2] == 'pending' then
    return PENDING, r
  end
  local st = COMPLETED
  if f[2] == 'not_replayable' then
    st = NOT_REPLAYABLE
  elseif f[2] ~= 'completed' then
    return UNREADABLE, NOTHING
  end
  -- A completed record has a result (perhaps ""), a not-replayable one its
  -- reason; one without is unreadable.
  if withresult then
    if not f[6] then
      return UNREADABLE, NOTHING
    end
    r.result, r.size = f[6], #f[6]
  else
    if redis.call('HEXISTS', key, 'result') == 0 then
      return UNREADABLE, NOTHING
    end
    r.size = redis.call('HSTRLEN', key, 'result')
  end
  return st, r
end

-- pttl returns the remaining time to live of key in milliseconds, or 0 when
-- it has none (no expiry) or is absent.
local function pttl(key)
  local ms = redis.call('PTTL', key)
  if ms < 0 then
    return 0
  end
  return ms
end

-- wedged reports whether the pending record at key is abandoned: it has no
-- expiry at all (an operator's PERSIST, a restore without a TTL). That is
-- the only evidence a record gives that its holder is gone, and so the only
-- rule: a live holder's record always expires (its reservation and each
-- renewal set the expiry), and how long it has left says nothing, since
-- another process may run with another lease. A caller's own lease never
-- decides it.
local function wedged(key)
  return redis.call('PTTL', key) == -1
end
