-- bloom_renew: extend a running build's lock and its candidate, only while
-- the caller still owns the lock. A build renews every few seconds, so the
-- lock can be short: a crashed builder blocks the next build only briefly.
--
-- KEYS[1]  build-lock
-- KEYS[2]  candidate bitmap (build:<owner>)
-- ARGV[1]  owner token
-- ARGV[2]  lock TTL in milliseconds
-- ARGV[3]  candidate TTL in milliseconds
--
-- Returns: 1 renewed, 0 the lock is not ours (expired or taken over).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
