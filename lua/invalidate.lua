-- invalidate: replace the generation with a fresh unique value, so every
-- entry stamped with an older value is dead at once and every outstanding
-- ticket can no longer publish (docs/architecture.md#generation-protocol).
-- Idempotent in effect.
--
-- KEYS[1]  generation key
-- ARGV[1]  nonce: caller's random token, makes the value unique
-- ARGV[2]  gen_ttl in milliseconds
--
-- Returns: the new generation (bulk string). It never equals the old one,
-- even if a caller reuses a nonce within one microsecond.
--
-- The DEL comes first so that an invalidation is applied even at maxmemory
-- with noeviction: Redis refuses a script's first write if it may use
-- memory (SET), but lets a script that has already written run to its end.
local old = redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[1])
local t = redis.call('TIME')
local gen = string.format('%s.%06d-%s', t[1], tonumber(t[2]), ARGV[1])
if gen == old then
  gen = gen .. '+'
end
redis.call('SET', KEYS[1], gen, 'PX', ARGV[2])
return gen
