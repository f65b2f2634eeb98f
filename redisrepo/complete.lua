-- complete.lua: complete-if-owner.
-- KEYS[1] the record's key
-- ARGV[1] owner token, as format 2 stores it
-- ARGV[2] result
-- ARGV[3] time to live in milliseconds
-- ARGV[4] the wake-up channel
-- ARGV[5] the state byte to write: COMPLETED, or NOT_REPLAYABLE (ARGV[2] is
--         then the reason)
-- ARGV[6] the command that announces: PUBLISH, or SPUBLISH (a sharded
--         channel in the key's slot, on Redis Cluster)
-- When the key holds a pending record owned by ARGV[1], it writes the
-- record of state ARGV[5] (same token and fingerprint, no waiters flag), publishes
-- the key on ARGV[4] if a caller waits on it, and returns 1; else 0.
local key = KEYS[1]
local v = owned(key, ARGV[1])
if not v then
  return 0
end
local flags = string.byte(v, 3)
local w = waited(v)
if w then
  flags = flags - FLAG_WAITERS
end
redis.call('SET', key, string.char(VERSION2, tonumber(ARGV[5]), flags) .. string.sub(v, 4) .. ARGV[2], 'PX', ARGV[3])
if w then
  redis.call(ARGV[6], ARGV[4], key)
end
return 1
