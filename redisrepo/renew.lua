-- renew.lua: renew-if-owner.
-- KEYS[1] the record's key
-- ARGV[1] owner token, as format 2 stores it
-- ARGV[2] lease in milliseconds
-- Returns 1 when the key holds a pending record owned by ARGV[1], whose time
-- to live is now ARGV[2], else 0.
if not owned(KEYS[1], ARGV[1]) then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
