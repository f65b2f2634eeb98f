-- fence.lua: Reserve of a fenced operation's reservation (ReserveFenced):
-- reserve.lua's write, and with it the key's next fence.
-- KEYS[1] the record's key
-- KEYS[2] its fence key, in the same hash slot (fenceKey)
-- ARGV[1] the pending record to write, format 2
-- ARGV[2] its lease in milliseconds
-- ARGV[3] "1" when the write replaces (Write.Replace), else "0"
-- ARGV[4] token of the record to replace, as format 2 stores it
-- ARGV[5] the same token as given, as format 1 stores it
-- ARGV[6] the writer's own token, as format 2 stores it
-- ARGV[7] time to live of the fence key in milliseconds
-- Writes ARGV[1] when reserve.lua would (and, without ARGV[3], only over
-- an absent key or a wedged pending record), and then returns the fence:
-- one more than the fence key holds, or the server's clock in microseconds
-- when that is more, which it stores in the fence key. Else it returns
-- {v, fence} when the key holds the writer's own pending record v (fence:
-- the one it was written with), or what is there as reserve.lua does.
local key = KEYS[1]
local t = keytype(key)
if t == 'string' then
  local v = redis.call('GET', key)
  local st, r = parse2(v)
  if st == PENDING and r.token == ARGV[6] then
    return {v, tonumber(redis.call('GET', KEYS[2]) or '0')}
  end
  if (st == PENDING and not wedged(key)) or (st ~= PENDING and (ARGV[3] ~= '1' or r.token ~= ARGV[4])) then
    return v
  end
elseif t ~= 'none' then
  local st, r = load(key, true)
  if (st == PENDING and not wedged(key)) or (st ~= PENDING and (ARGV[3] ~= '1' or r.token ~= ARGV[5])) then
    return {st, r.token, r.fp, r.result, pttl(key)}
  end
end
local now = redis.call('TIME')
local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, tonumber(now[1]) * 1000000 + tonumber(now[2]))
redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[7])
redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
return fence
