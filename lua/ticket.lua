-- ticket: the object's current generation; creates a fresh one if missing.
-- A ticket is therefore never absent
-- (docs/architecture.md#generation-protocol). Needs Redis >= 5 (TIME in a
-- writing script relies on effects replication, the default since 5.0).
--
-- KEYS[1]  generation key
-- ARGV[1]  nonce: caller's random token, makes the value unique
-- ARGV[2]  gen_ttl in milliseconds (refreshed on every call)
--
-- Returns: the current generation (bulk string, never nil).
local gen = redis.call('GET', KEYS[1])
if gen then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return gen
end
local t = redis.call('TIME')
gen = string.format('%s.%06d-%s', t[1], tonumber(t[2]), ARGV[1])
redis.call('SET', KEYS[1], gen, 'PX', ARGV[2])
return gen
