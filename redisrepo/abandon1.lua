-- abandon1.lua: take over a wedged pending format 1 record (see wedged),
-- which Reserve met as a HASH: the rare case of abandon.lua.
-- KEYS[1] the record's key
-- ARGV[1] the record to write, format 2
-- ARGV[2] time to live in milliseconds
-- ARGV[3] the token of the pending record Reserve met, as given
-- Writes ARGV[1] when the key is absent, or holds a pending record of either
-- format with token ARGV[3] that is wedged, and returns 1. Else it returns
-- what is there as reserve.lua does: the STRING, or {state, token,
-- fingerprint, result, pttl} as load reads it.
local key = KEYS[1]
local st, r = load(key, true)
if st == ABSENT or (st == PENDING and r.token == ARGV[3] and wedged(key)) then
  redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
  return 1
end
if keytype(key) == 'string' then
  return redis.call('GET', key)
end
return {st, r.token, r.fp, r.result, pttl(key)}
