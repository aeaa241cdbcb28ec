-- tag_tickets_since: tag tickets for the tags a fill learned only from its
-- answer (docs/invalidation.md#cache-tags): the current generation of each,
-- created fresh where missing, but only if none of them was replaced since the
-- fill began. A generation's value starts with the store's clock when it was
-- made ('<seconds>.<microseconds>-...'), and every invalidation makes a fresh
-- one, so a generation made before the fill's start proves that tag was not
-- invalidated during the fill. The caller then publishes with these as tag
-- tickets (publish_checked.lua), so a change after this call is refused too.
--
-- KEYS     tag generation keys (single node only: one clock)
-- ARGV[1]  nonce: caller's random token, makes a fresh value unique
-- ARGV[2]  gen_ttl in milliseconds
-- ARGV[3]  the fill's start, '<seconds>.<microseconds>' (tag_tickets.lua's clock)
--
-- Returns: {'1', generation per key...} when none was made at or after the
-- start (nothing written otherwise); {'0'} when one was (or has no readable
-- time: counted as moved).
local function micros(v)
  local s, u = string.match(v, '^(%d+)%.(%d+)')
  if not s then
    return nil
  end
  return tonumber(s) * 1000000 + tonumber(u)
end
local since = micros(ARGV[3])
if not since then
  return redis.error_reply('tag_tickets_since: bad start')
end
local gens = {}
for i = 1, #KEYS do
  local gen = redis.call('GET', KEYS[i])
  if gen then
    local at = micros(gen)
    if not at or at >= since then
      return {'0'}
    end
  end
  gens[i] = gen or false
end
local out = {'1'}
local t = nil
for i = 1, #KEYS do
  local gen = gens[i]
  if gen then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  else
    t = t or redis.call('TIME')
    gen = string.format('%s.%06d-%s', t[1], tonumber(t[2]), ARGV[1])
    redis.call('SET', KEYS[i], gen, 'PX', ARGV[2])
  end
  out[i + 1] = gen
end
return out
