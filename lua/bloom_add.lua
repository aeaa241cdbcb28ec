-- bloom_add: growth (docs/bloom.md#growth). Sets a new member's bits in the
-- active filter and, if a build is running, in its candidate, so the member
-- survives the candidate's activation. The caller names the candidate from the
-- lock owner it read just before; if the lock changed since, nothing is written
-- and the caller re-reads and retries (every key stays in KEYS).
--
-- KEYS[1]  bits (active bitmap; written only if it exists)
-- KEYS[2]  build-lock
-- KEYS[3]  candidate of the build the caller saw (absent: no build seen)
-- ARGV[1]  lock owner the caller saw, "" for none
-- ARGV[2..] the member's bit positions
--
-- Returns: 1 written, -1 the lock owner changed (re-read and retry).
local owner = redis.call('GET', KEYS[2]) or ''
if owner ~= ARGV[1] then
  return -1
end
local active = redis.call('EXISTS', KEYS[1]) == 1
local building = KEYS[3] ~= nil and redis.call('EXISTS', KEYS[3]) == 1
for i = 2, #ARGV do
  if active then
    redis.call('SETBIT', KEYS[1], ARGV[i], 1)
  end
  if building then
    redis.call('SETBIT', KEYS[3], ARGV[i], 1)
  end
end
return 1
