-- bloom_activate: publish a complete candidate as the active filter, only
-- if the caller still holds the build lock (a builder whose lock expired
-- lost the right to publish; its candidate just expires).
--
-- KEYS[1]  build-lock
-- KEYS[2]  candidate bitmap
-- KEYS[3]  bits (active bitmap)
-- KEYS[4]  ready
-- ARGV[1]  owner token
-- ARGV[2]  signature to write to ready
-- ARGV[3]  m: a candidate shorter than m bits is never activated
--
-- Returns: 1 activated, 0 not the lock owner or candidate missing/short.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if redis.call('STRLEN', KEYS[2]) * 8 < tonumber(ARGV[3]) then
  return 0
end
redis.call('RENAME', KEYS[2], KEYS[3])
redis.call('PERSIST', KEYS[3])
redis.call('SET', KEYS[4], ARGV[2])
return 1
