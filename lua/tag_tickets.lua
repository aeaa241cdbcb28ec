-- tag_tickets: the current generation of each cache tag, created fresh
-- where missing (as ticket.lua, for tags: docs/invalidation.md#cache-tags). A
-- filler reads them before its upstream call and stamps them into the entry, so
-- a tag invalidated during the fill makes the entry dead. TTLs are refreshed: a
-- tag key outlives every entry stamped with it.
--
-- KEYS     tag generation keys (single node: any; Cluster: one per call)
-- ARGV[1]  nonce: caller's random token, makes a fresh value unique
-- ARGV[2]  gen_ttl in milliseconds
--
-- Returns: the generations, one per key, in order.
local out = {}
local t = nil
for i = 1, #KEYS do
  local gen = redis.call('GET', KEYS[i])
  if gen then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  else
    t = t or redis.call('TIME')
    gen = string.format('%s.%06d-%s', t[1], tonumber(t[2]), ARGV[1])
    redis.call('SET', KEYS[i], gen, 'PX', ARGV[2])
  end
  out[i] = gen
end
return out
