-- inspect.lua: describe records for operators, without their results.
-- KEYS    the records' keys, all in one cluster hash slot
-- Returns a flat array of five entries per key, in the order of KEYS:
-- state, fingerprint, result size in bytes, created_ms ("" when unknown),
-- and the PTTL reply (-2 absent, -1 no expiry, else milliseconds).
-- The record is read by load (record.lua), without its result. The time to
-- live is the raw PTTL reply, not pttl's: an operator is told about a key
-- without an expiry.
local out = {}
for i, key in ipairs(KEYS) do
  local st, r = load(key, false)
  local n = #out
  out[n + 1] = st
  out[n + 2] = r.fp
  out[n + 3] = r.size
  out[n + 4] = r.created_ms
  out[n + 5] = redis.call('PTTL', key)
end
return out
