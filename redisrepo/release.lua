-- release.lua: release-if-owner.
-- KEYS[1] the record's key
-- ARGV[1] owner token, as format 2 stores it
-- ARGV[2] the wake-up channel
-- ARGV[3] the command that announces: PUBLISH, or SPUBLISH
-- When the key holds a pending record owned by ARGV[1], it deletes it,
-- publishes the key on ARGV[2] if a caller waits on it, and returns 1; else
-- 0.
local v = owned(KEYS[1], ARGV[1])
if not v then
  return 0
end
redis.call('DEL', KEYS[1])
if waited(v) then
  redis.call(ARGV[3], ARGV[2], KEYS[1])
end
return 1
