-- witness: takes or keeps one of the k witness slots of a feed
-- (src/invalidation/witness.rs, docs/invalidation.md "Witnesses"). Only
-- witnesses run a feed's fan-out; a slot whose holder stops renewing
-- expires after its TTL and the next instance to try takes it.
--
-- KEYS[1..k]  the feed's slot keys (one hash tag: one Cluster slot)
-- ARGV[1]     owner: the calling process's token
-- ARGV[2]     slot TTL in milliseconds
--
-- Returns: {index, ms}. index: the 0-based slot the owner holds now
-- (renewed or just taken), or -1 when every slot is held by another owner;
-- ms: then the time until the first of them expires (when to try again),
-- else the TTL.

for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    return {i - 1, tonumber(ARGV[2])}
  end
end
local first = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {i - 1, tonumber(ARGV[2])}
  end
  local left = redis.call('PTTL', key)
  if left >= 0 and left < first then
    first = left
  end
end
return {-1, first}
