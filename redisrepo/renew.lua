-- renew.lua: renew-if-owner.
-- KEYS[1] the record's key
-- ARGV[1] owner token
-- ARGV[2] lease in milliseconds
-- Returns 1 when the key holds a pending record owned by ARGV[1], whose time
-- to live is now ARGV[2], else 0.
local key = KEYS[1]
if not owned(key, ARGV[1]) then
  return 0
end
redis.call('PEXPIRE', key, ARGV[2])
return 1
