-- legacy.lua: read a record that is not a STRING, which Reserve and Get meet
-- as a WRONGTYPE error: a format 1 HASH (written before an upgrade), or
-- something no reader knows.
-- KEYS[1] the record's key
-- Returns the STRING under the key if it is one now (written since: Go reads
-- it as GET would), 0 when it is absent, else {state, token, fingerprint,
-- result, pttl} as load reads it: never nil.
local key = KEYS[1]
local t = keytype(key)
if t == 'string' then
  return redis.call('GET', key)
end
if t == 'none' then
  return 0
end
local st, r = load(key, true)
return {st, r.token, r.fp, r.result, pttl(key)}
