local VERSION, VERSION2 = "1", 2
local ABSENT, PENDING, COMPLETED, UNREADABLE, NOT_REPLAYABLE = 0, 1, 2, 3, 4
local FLAG_WAITERS, FLAG_TOKEN_HEX, FLAG_FP_HEX = 1, 2, 4
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
local function waited(v)
return string.byte(v, 3) % (FLAG_WAITERS * 2) >= FLAG_WAITERS
end
local key = KEYS[1]
local v = owned(key, ARGV[1])
if not v then
return 0
end
local flags = string.byte(v, 3)
local w = waited(v)
if w then
flags = flags - FLAG_WAITERS
end
redis.call('SET', key, string.char(VERSION2, tonumber(ARGV[5]), flags) .. string.sub(v, 4) .. ARGV[2], 'PX', ARGV[3])
if w then
redis.call(ARGV[6], ARGV[4], key)
end
return 1
