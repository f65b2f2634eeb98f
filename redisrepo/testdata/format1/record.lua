-- record.lua is the prelude of every script in this package: Go prepends it
-- to the body of each script, so the record format is read in one place.
-- scripts.go writes, before it, the constants that Go and Lua share, from
-- their Go values (record.go): VERSION, the format version this package
-- reads and writes, and the state codes of the replies, ABSENT, PENDING,
-- COMPLETED and UNREADABLE.
--
-- A record is a HASH under one key (see docs/architecture.md, Redis layout):
--   v           format version, "1"
--   state       "pending" or "completed"
--   token       owner token of the reservation
--   fp          request fingerprint, "" for none
--   result      encoded result (completed records only)
--   created_ms  Redis server time of the write, Unix milliseconds
-- Readers ignore fields they do not know. Anything else under the key (another
-- Redis type, a missing field, an unknown state or version) is unreadable.

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
local NOTHING = {token = '', fp = '', created_ms = '', result = '', size = 0}

-- load reads the record at key: the one reader of the record format. It
-- returns the record's state and a table of its fields:
--   token, fp    the owner token and the request fingerprint
--   created_ms   the time of the write, "" when the record has none
--   size         the length of the result in bytes, 0 for a pending record
--   result       the result, "" for a pending record and unless withresult
-- With withresult false it does not read the result, which may be large:
-- only whether it is there, and its size. An absent or unreadable record has
-- the table NOTHING.
local function load(key, withresult)
  local t = keytype(key)
  if t == 'none' then
    return ABSENT, NOTHING
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
  local r = {token = f[3], fp = f[4], created_ms = f[5] or '', result = '', size = 0}
  if f[2] == 'pending' then
    return PENDING, r
  end
  if f[2] ~= 'completed' then
    return UNREADABLE, NOTHING
  end
  -- A completed record has a result (perhaps ""); one without is unreadable.
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
  return COMPLETED, r
end

-- read returns the state, token, fingerprint and result of the record at key,
-- as load reads it. An unreadable record has token, fingerprint and result "".
local function read(key)
  local st, r = load(key, true)
  return st, r.token, r.fp, r.result
end

-- owned reports whether key holds a readable pending record owned by token.
-- It reads the record exactly as read does, so that the owner scripts never
-- act on a record that Get and Reserve call unreadable.
local function owned(key, token)
  local st, tok = read(key)
  return st == PENDING and tok == token
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

-- now_ms returns the Redis server's time as a string of Unix milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
end
