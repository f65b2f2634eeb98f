-- watch.lua: read a record as GET does, and mark a pending format 2 record
-- as waited on, so that its completion or release publishes its key. A
-- pending record with no expiry at all is wedged (see record.lua's wedged;
-- this script is sent without that prelude): it is deleted and reported
-- absent, so that the waiter reserves the key instead of waiting on it for
-- ever, at no cost to a wait on a live holder.
-- KEYS[1] the record's key
-- Returns what GET returns: the STRING, nil when absent (or wedged), or the
-- WRONGTYPE error for a HASH (Go then reads it with legacy.lua). A mark that
-- Redis refuses (OOM: maxmemory reached) is left out: the read still
-- succeeds, and the waiter polls; so is a delete (the waiter then waits as
-- before).
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' and #v >= 6 and string.byte(v, 1) == VERSION2 and string.byte(v, 2) == PENDING then
  if redis.call('PTTL', KEYS[1]) == -1 and type(redis.pcall('DEL', KEYS[1])) == 'number' then
    return false
  end
  local flags = string.byte(v, 3)
  if flags % (FLAG_WAITERS * 2) < FLAG_WAITERS then
    redis.pcall('SETRANGE', KEYS[1], 2, string.char(flags + FLAG_WAITERS))
  end
end
return v
