-- reserve.lua: reserve-or-read.
-- KEYS[1] the record's key
-- ARGV[1] state to write: "pending" or "completed"
-- ARGV[2] owner token
-- ARGV[3] fingerprint ("" for none)
-- ARGV[4] result (written only when ARGV[1] is "completed")
-- ARGV[5] time to live in milliseconds
-- ARGV[6] "1" to replace a record that is not pending and has token ARGV[7]
-- ARGV[7] token of the record to replace ("" for an unreadable one)
-- Returns 1 when it wrote the record, else the existing record as
-- {state, token, fingerprint, result, pttl}: never nil.
local key = KEYS[1]
local st, tok, fp, res = read(key)
if st ~= ABSENT then
  if ARGV[6] ~= '1' or st == PENDING or tok ~= ARGV[7] then
    return {st, tok, fp, res, pttl(key)}
  end
  redis.call('DEL', key)
end
if ARGV[1] == 'completed' then
  redis.call('HSET', key, 'v', VERSION, 'state', 'completed', 'token', ARGV[2], 'fp', ARGV[3],
    'created_ms', now_ms(), 'result', ARGV[4])
else
  redis.call('HSET', key, 'v', VERSION, 'state', 'pending', 'token', ARGV[2], 'fp', ARGV[3],
    'created_ms', now_ms())
end
redis.call('PEXPIRE', key, ARGV[5])
return 1
