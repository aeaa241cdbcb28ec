-- bloom_begin: take the build lock and create the empty candidate bitmap in
-- one step, so a concurrent bloom_add never sees the lock held without a
-- candidate to write into (its bits would be lost at activation).
--
-- KEYS[1]  build-lock
-- KEYS[2]  candidate bitmap (build:<owner>)
-- ARGV[1]  owner token (fresh per attempt; also the candidate's suffix)
-- ARGV[2]  lock TTL in milliseconds
-- ARGV[3]  m: bits in the bitmap (the candidate is allocated at full size)
-- ARGV[4]  candidate TTL in milliseconds (a crashed build leaves nothing)
--
-- Returns: 1 lock taken and candidate created, 0 another build holds the lock.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
redis.call('DEL', KEYS[2])
redis.call('SETBIT', KEYS[2], tonumber(ARGV[3]) - 1, 0)
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
