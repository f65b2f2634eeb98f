-- get.lua: read a record.
-- KEYS[1] the record's key
-- Returns 0 when the key is absent, else {state, token, fingerprint, result,
-- pttl}: never nil.
local key = KEYS[1]
local st, tok, fp, res = read(key)
if st == ABSENT then
  return 0
end
return {st, tok, fp, res, pttl(key)}
