-- reserve.lua: the compare-and-swap write that heals a record (Reserve with
-- Write.Replace). A plain Reserve is one SET NX GET, no script.
-- KEYS[1] the record's key
-- ARGV[1] the record to write, format 2
-- ARGV[2] time to live in milliseconds
-- ARGV[3] token of the record to replace, as format 2 stores it ("" for an
--         unreadable record)
-- ARGV[4] the same token as given, as format 1 stores it
-- Writes ARGV[1] when the key is absent, or holds a record that is not
-- pending and has token ARGV[3] (format 2) or ARGV[4] (format 1), or
-- something unreadable and the token is "", or a wedged pending record (see
-- wedged) of either format. Returns 1 when it wrote, else
-- what is there: the STRING (Go reads it as GET would), or for anything
-- else {state, token, fingerprint, result, pttl} as load reads it.
local key = KEYS[1]
local t = keytype(key)
if t == 'string' then
  local v = redis.call('GET', key)
  local st, r = parse2(v)
  if (st == PENDING and not wedged(key)) or (st ~= PENDING and r.token ~= ARGV[3]) then
    return v
  end
elseif t ~= 'none' then
  local st, r = load(key, true)
  if (st == PENDING and not wedged(key)) or (st ~= PENDING and r.token ~= ARGV[4]) then
    return {st, r.token, r.fp, r.result, pttl(key)}
  end
end
redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
return 1
