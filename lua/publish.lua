-- publish: write a cache entry only if the generation has not moved since
-- the filler's ticket and the filler still holds the lease (closes the
-- stale-backfill race, docs/architecture.md#no-stale-backfill; a missing
-- generation counts as moved, closing ABA). The generation is checked first: a
-- fill superseded by one of a newer generation (lease.lua) is refused as
-- "generation changed".
--
-- KEYS[1]  lease key
-- KEYS[2]  generation key
-- KEYS[3]  entry key
-- ARGV[1]  lease value ('<owner>@<ticket>', as lease.lua set it)
-- ARGV[2]  ticket (the generation the filler read before fetching)
-- ARGV[3]  entry bytes
-- ARGV[4]  entry TTL in milliseconds
--
-- Returns:  1 published
--           0 lease is not ours (expired or taken by another filler)
--          -1 generation differs from the ticket (invalidated or lost)
if redis.call('GET', KEYS[2]) ~= ARGV[2] then
  return -1
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
return 1
