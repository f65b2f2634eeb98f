-- abandon.lua: take over a wedged pending record, which Reserve met: the
-- extra step of a collision, never of a replay or a first run. A pending
-- record is wedged when it has no expiry (an operator's PERSIST, a
-- restore) or, met by a reservation, a time to live longer than ten of the
-- reservation's leases: no holder renews its lease past its length, so it
-- would be waited on for ever.
-- KEYS[1] the record's key
-- ARGV[1] the record to write, format 2
-- ARGV[2] time to live in milliseconds
-- ARGV[3] "1" when ARGV[1] is a pending record (ARGV[2] is then a lease)
-- ARGV[4] the token of the pending record Reserve met, as format 2 stores it
-- Writes ARGV[1] when the key is absent (expired since), or holds that
-- pending record and it is wedged, and returns nil. Else it returns what GET
-- returns: the STRING, or the WRONGTYPE error for a HASH.
local key = KEYS[1]
local v = owned(key, ARGV[4])
if v then
  -- As record.lua's wedged, with its WEDGE_LEASES (this script is sent
  -- without the prelude).
  local ms = redis.call('PTTL', key)
  if ms ~= -1 and (ARGV[3] ~= '1' or ms <= 10 * tonumber(ARGV[2])) then
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
