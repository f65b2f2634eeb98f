-- owner.lua is the prelude of the owner scripts (complete, renew, release)
-- and of watch.lua: small, so that they can be sent whole with EVAL on every
-- call and never meet an empty script cache. scripts.go writes VERSION2,
-- PENDING, COMPLETED and FLAG_WAITERS before it.

-- owned returns the format 2 record at key if it is pending and owned by
-- token (as format 2 stores it), else nil. Anything else under the key,
-- including a format 1 HASH, is not owned.
local function owned(key, token)
  local v = redis.pcall('GET', key)
  if type(v) ~= 'string' or #v < 6 or string.byte(v, 1) ~= VERSION2 or string.byte(v, 2) ~= PENDING then
    return nil
  end
  local tl = string.byte(v, 4)
  if #v ~= 6 + tl + string.byte(v, 5) * 256 + string.byte(v, 6) or string.sub(v, 7, 6 + tl) ~= token then
    return nil
  end
  return v
end

-- waited reports whether a caller waits on the pending record v: it was
-- marked by watch.lua.
local function waited(v)
  return string.byte(v, 3) % (FLAG_WAITERS * 2) >= FLAG_WAITERS
end
