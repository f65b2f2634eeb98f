-- owner1.lua: the owner-checked steps in record format 1
-- (WithRecordFormat(Format1)): complete, renew or release a pending HASH.
-- KEYS[1] the record's key
-- ARGV[1] the step: "complete", "renew" or "release"
-- ARGV[2] owner token
-- ARGV[3] result, or reason (complete)
-- ARGV[4] time to live in milliseconds (complete, renew)
-- ARGV[5] the state to write (complete): "completed" or "not_replayable"
-- Returns 1 when the key held a pending format 1 record owned by ARGV[2] and
-- the step is done, else 0.
local key = KEYS[1]
if keytype(key) ~= 'hash' then
  return 0
end
local st, r = load(key, false)
if st ~= PENDING or r.token ~= ARGV[2] then
  return 0
end
if ARGV[1] == 'complete' then
  redis.call('HSET', key, 'state', ARGV[5], 'result', ARGV[3])
  redis.call('PEXPIRE', key, ARGV[4])
elseif ARGV[1] == 'renew' then
  redis.call('PEXPIRE', key, ARGV[4])
else
  redis.call('DEL', key)
end
return 1
