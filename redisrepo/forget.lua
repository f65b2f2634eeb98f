-- forget.lua: delete records whoever owns them.
-- KEYS    the records' keys, all in one cluster hash slot
-- Returns the number of keys deleted.
local n = 0
for i, key in ipairs(KEYS) do
  n = n + redis.call('DEL', key)
end
return n
