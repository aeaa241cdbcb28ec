-- tag_tickets: the current generation of each cache tag, created fresh
-- where missing (as ticket.lua, for tags: docs/invalidation.md#cache-tags). A
-- filler reads them before its upstream call and stamps them into the entry, so
-- a tag invalidated during the fill makes the entry dead. TTLs are refreshed: a
-- tag key outlives every entry stamped with it.
--
-- KEYS     tag generation keys (single node: any; Cluster: one per call)
-- ARGV[1]  nonce: caller's random token, makes a fresh value unique
-- ARGV[2]  gen_ttl in milliseconds
-- ARGV[3]  optional: '1' to also return the store's clock ("when the fill
--          began", for tags the filler learns only from its answer:
--          tag_tickets_since.lua)
--
-- Returns: the generations, one per key, in order; with ARGV[3] == '1' then
-- the clock as '<seconds>.<microseconds>' (the shape of a generation's time).
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
if ARGV[3] == '1' then
  t = t or redis.call('TIME')
  out[#KEYS + 1] = string.format('%s.%06d', t[1], tonumber(t[2]))
end
return out
