-- abandon.lua: take over a wedged pending record that Reserve keeps meeting
-- (see Store.sightings): never a step of a replay, a first run or a
-- collision's first meeting. A pending record is wedged when it has no
-- expiry at all (an operator's PERSIST, a restore without a TTL): the only
-- evidence a record gives that its holder is gone (record.lua's wedged; this
-- script is sent without that prelude).
-- KEYS[1] the record's key
-- ARGV[1] the record to write, format 2
-- ARGV[2] time to live in milliseconds
-- ARGV[3] the token of the pending record Reserve met, as format 2 stores it
-- Writes ARGV[1] when the key is absent (expired since), or holds that
-- pending record and it is wedged, and returns nil. Else it returns what GET
-- returns: the STRING, or the WRONGTYPE error for a HASH.
local key = KEYS[1]
local v = owned(key, ARGV[3])
if v then
  if redis.call('PTTL', key) ~= -1 then
    return v
  end
else
  v = redis.pcall('GET', key)
  if v then
    return v
  end
end
redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
return nil
