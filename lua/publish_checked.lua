-- publish_checked: publish.lua for an entry that also depends on a version
-- floor and/or cache tags (docs/invalidation.md#dependent-invalidation).
-- Written only if, besides the generation and the lease, the answer's version
-- is not below the object's floor and every tag generation still equals the one
-- the filler read before its upstream call (a missing one counts as moved).
--
-- KEYS[1]  lease key
-- KEYS[2]  generation key
-- KEYS[3]  entry key
-- KEYS[4]  floor key
-- KEYS[5..] tag generation keys (single node only: other slots)
-- ARGV[1]  lease value ('<owner>@<ticket>')
-- ARGV[2]  ticket
-- ARGV[3]  entry bytes
-- ARGV[4]  entry TTL in milliseconds
-- ARGV[5]  the answer's version, '' if it has none
-- ARGV[6]  '1' to check the floor, '0' not to
-- ARGV[7..] the tag tickets, one per tag key, in order
--
-- Returns, the first that applies in this order:
--          -1 generation differs from the ticket
--          -3 a tag generation moved since its ticket
--           0 lease is not ours
--          -2 below the floor (or no version while a floor exists)
--           1 published
if redis.call('GET', KEYS[2]) ~= ARGV[2] then
  return -1
end
-- Tags before the lease: a fill superseded because a tag moved
-- (lease.lua) must learn that a tag moved, so that its answer goes only to
-- the request that started it.
for i = 5, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[i + 2] then
    return -3
  end
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[6] == '1' then
  local floor = tonumber(redis.call('GET', KEYS[4]) or '')
  if floor then
    local version = tonumber(ARGV[5])
    if not version or version < floor then
      return -2
    end
  end
end
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
return 1
