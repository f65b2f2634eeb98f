-- reserve1.lua: Reserve in record format 1 (WithRecordFormat(Format1)),
-- which releases before format 2 can read: reserve-or-read, writing a HASH.
-- KEYS[1] the record's key
-- ARGV[1] state to write: "pending", "completed" or "not_replayable"
-- ARGV[2] owner token
-- ARGV[3] fingerprint ("" for none)
-- ARGV[4] result, or reason (written unless ARGV[1] is "pending")
-- ARGV[5] time to live in milliseconds
-- ARGV[6] "1" to replace a record that is not pending and has token ARGV[7]
-- ARGV[7] token of the record to replace ("" for an unreadable one)
-- It also writes over a wedged pending record (see wedged), in either
-- format. Returns 1 when it wrote the record, else the existing record, of
-- either format, as {state, token, fingerprint, result, pttl}: never nil.
local key = KEYS[1]
local st, r = load(key, true)
if st ~= ABSENT then
  local abandoned = st == PENDING and wedged(key)
  if not abandoned and (ARGV[6] ~= '1' or st == PENDING or r.token ~= ARGV[7]) then
    return {st, r.token, r.fp, r.result, pttl(key)}
  end
  -- A format 1 record is overwritten field by field, so that a write Redis
  -- refuses (OOM) leaves it as it was; anything else is deleted first.
  if st == UNREADABLE or keytype(key) ~= 'hash' then
    redis.call('DEL', key)
  end
end
local t = redis.call('TIME')
local now = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
if ARGV[1] ~= 'pending' then
  redis.call('HSET', key, 'v', VERSION, 'state', ARGV[1], 'token', ARGV[2], 'fp', ARGV[3],
    'created_ms', now, 'result', ARGV[4])
else
  redis.call('HSET', key, 'v', VERSION, 'state', 'pending', 'token', ARGV[2], 'fp', ARGV[3],
    'created_ms', now)
  redis.call('HDEL', key, 'result')
end
redis.call('PEXPIRE', key, ARGV[5])
return 1
