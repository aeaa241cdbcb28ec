-- inspect: everything stored for one object variant, for the operator's
-- /admin/lookup. Reads only.
--
-- KEYS[1]  entry key
-- KEYS[2]  generation key
-- KEYS[3]  lease key
-- ARGV     none
--
-- Returns: { entry, entry PTTL, generation, generation PTTL, lease owner,
-- lease PTTL }; a missing value is false (nil), a PTTL is -2 for a missing
-- key and -1 for a key without a TTL.
local out = {}
for i = 1, 3 do
  out[2 * i - 1] = redis.call('GET', KEYS[i])
  out[2 * i] = redis.call('PTTL', KEYS[i])
end
return out
