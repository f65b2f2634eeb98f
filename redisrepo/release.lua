-- release.lua: release-if-owner.
-- KEYS[1] the record's key
-- ARGV[1] owner token
-- Returns 1 when the key held a pending record owned by ARGV[1] and is now
-- deleted, else 0.
local key = KEYS[1]
if not owned(key, ARGV[1]) then
  return 0
end
redis.call('DEL', key)
return 1
