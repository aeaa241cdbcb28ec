-- lease: take the fill lease of one object variant together with the
-- fill's ticket (the current generation, created fresh if missing, as in
-- ticket.lua). A lease held by a fill whose ticket is no longer current is
-- superseded: that fill can never publish, and waiting for it would hand
-- readers an answer fetched before the invalidation
-- (docs/architecture.md#no-older-answer-after-an-invalidation).
--
-- KEYS[1]  lease key
-- KEYS[2]  generation key
-- ARGV[1]  owner token (never contains '@')
-- ARGV[2]  nonce: caller's random token, for a fresh generation
-- ARGV[3]  lease TTL in milliseconds
-- ARGV[4]  gen_ttl in milliseconds (refreshed on every call)
--
-- The lease's value is '<owner>@<ticket>'; publish, renew and unlock
-- compare the whole value.
-- Returns: {1, ticket} won, the lease was free
--          {2, ticket} won, a fill of an older generation was superseded
--          {0, ticket} held by a fill of the current generation: wait
-- The first write is a SET (lease or new generation): at maxmemory with
-- noeviction Redis refuses it, and the fill takes the degraded path, as a
-- store that refuses writes should make it (PEXPIRE first would let the
-- script write on).
local gen = redis.call('GET', KEYS[2])
local existed = gen
if not gen then
  local t = redis.call('TIME')
  gen = string.format('%s.%06d-%s', t[1], tonumber(t[2]), ARGV[2])
  redis.call('SET', KEYS[2], gen, 'PX', ARGV[4])
end
local code = 1
local held = redis.call('GET', KEYS[1])
if held then
  local at = string.find(held, '@', 1, true)
  if at and string.sub(held, at + 1) == gen then
    if existed then
      redis.call('PEXPIRE', KEYS[2], ARGV[4])
    end
    return {0, gen}
  end
  code = 2
end
redis.call('SET', KEYS[1], ARGV[1] .. '@' .. gen, 'PX', ARGV[3])
if existed then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return {code, gen}
