-- complete.lua: complete-if-owner.
-- KEYS[1] the record's key
-- ARGV[1] owner token
-- ARGV[2] result
-- ARGV[3] time to live in milliseconds
-- Returns 1 when the key held a pending record owned by ARGV[1] and now holds
-- the completed record (same token and fingerprint), else 0.
local key = KEYS[1]
if not owned(key, ARGV[1]) then
  return 0
end
redis.call('HSET', key, 'state', 'completed', 'result', ARGV[2])
redis.call('PEXPIRE', key, ARGV[3])
return 1
