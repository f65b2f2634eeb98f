-- confirm.lua: an owner's completion sent again (redisrepo.WithReplicaAcks),
-- after complete.lua found no pending record of the owner.
-- KEYS[1] the record's key
-- ARGV[1] owner token, as format 2 stores it
-- ARGV[2] the state byte: COMPLETED, or NOT_REPLAYABLE
-- ARGV[3] time to live in milliseconds
-- When the key holds a format 2 record of state ARGV[2] owned by ARGV[1] (the
-- owner's earlier send went through), it sets its time to live to ARGV[3], a
-- write of this connection's own after the record, so that the WAIT that
-- follows on the connection covers the record, and returns 1; else 0.
local d = redis.pcall('GET', KEYS[1])
if type(d) == 'string' and #d > 6 and string.byte(d, 1) == VERSION2 and string.byte(d, 2) == tonumber(ARGV[2])
    and string.sub(d, 7, 6 + string.byte(d, 4)) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
