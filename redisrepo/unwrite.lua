-- unwrite.lua: take back a completed or not-replayable record that an
-- all-or-nothing ReserveMany wrote, when another entry of the call did not
-- write. A pending record is taken back with release.lua (owner1.lua in
-- format 1), which wakes its waiters; a record of a result has none.
-- KEYS[1] the record's key
-- ARGV[1] the writer's token, as format 2 stores it
-- ARGV[2] the same token as given, as format 1 stores it
-- Deletes the key and returns 1 when it holds a record, of either format,
-- that is not pending and has that token; else returns 0. The token is the
-- write's own, unique to it, so a record that has it is the one written.
local key = KEYS[1]
local t = keytype(key)
local st, r, token
if t == 'string' then
  st, r = parse2(redis.call('GET', key))
  token = ARGV[1]
elseif t == 'hash' then
  st, r = load(key, false)
  token = ARGV[2]
else
  return 0
end
if st == UNREADABLE or st == PENDING or r.token ~= token then
  return 0
end
redis.call('DEL', key)
return 1
