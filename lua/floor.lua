-- floor: raise an object's version floor (docs/invalidation.md#version-floors):
-- an invalidation with revision R means no answer older than R may be published
-- for the object again. Keeps the higher of the current floor and R, so floors
-- can be raised in any order and repeated.
--
-- KEYS[1]  floor key (same slot as the object's generation)
-- ARGV[1]  revision (integer)
-- ARGV[2]  TTL in milliseconds (gen_ttl: as long as an entry could live)
--
-- Returns: the floor now in force.
local current = tonumber(redis.call('GET', KEYS[1]) or '')
local floor = tonumber(ARGV[1])
if current and current > floor then
  floor = current
end
redis.call('SET', KEYS[1], string.format('%d', floor), 'PX', ARGV[2])
return floor
