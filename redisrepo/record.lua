-- record.lua is the prelude of every script in this package: Go prepends it
-- to the body of each script, so the record format is read in one place.
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

local VERSION = '1'
local ABSENT, PENDING, COMPLETED, UNREADABLE = 0, 1, 2, 3

-- keytype returns the Redis type of key as a string ("none" when absent).
local function keytype(key)
  local t = redis.call('TYPE', key)
  if type(t) == 'table' then
    return t.ok
  end
  return t
end

-- read returns the state, token, fingerprint and result of the record at key.
-- An unreadable record has token, fingerprint and result "".
local function read(key)
  local t = keytype(key)
  if t == 'none' then
    return ABSENT, '', '', ''
  end
  if t ~= 'hash' then
    return UNREADABLE, '', '', ''
  end
  local f = redis.call('HMGET', key, 'v', 'state', 'token', 'fp', 'result')
  if f[1] ~= VERSION or not f[3] or not f[4] then
    return UNREADABLE, '', '', ''
  end
  if f[2] == 'pending' then
    return PENDING, f[3], f[4], ''
  end
  if f[2] == 'completed' and f[5] then
    return COMPLETED, f[3], f[4], f[5]
  end
  return UNREADABLE, '', '', ''
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
