-- inspect.lua: describe records for operators, without their results.
-- KEYS    the records' keys, all in one cluster hash slot
-- Returns a flat array of five entries per key, in the order of KEYS:
-- state, fingerprint, result size in bytes, created_ms ("" when unknown),
-- and the PTTL reply (-2 absent, -1 no expiry, else milliseconds).
local out = {}
for i, key in ipairs(KEYS) do
  local t = keytype(key)
  local st, fp, size, created = ABSENT, '', 0, ''
  if t ~= 'none' then
    st = UNREADABLE
    if t == 'hash' then
      local f = redis.call('HMGET', key, 'v', 'state', 'token', 'fp', 'created_ms')
      if f[1] == VERSION and f[3] and f[4] then
        if f[2] == 'pending' then
          st = PENDING
        elseif f[2] == 'completed' and redis.call('HEXISTS', key, 'result') == 1 then
          st = COMPLETED
          size = redis.call('HSTRLEN', key, 'result')
        end
        if st ~= UNREADABLE then
          fp = f[4]
          created = f[5] or ''
        end
      end
    end
  end
  local n = #out
  out[n + 1] = st
  out[n + 2] = fp
  out[n + 3] = size
  out[n + 4] = created
  out[n + 5] = redis.call('PTTL', key)
end
return out
