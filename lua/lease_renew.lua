-- lease_renew: extend a fill lease only while the caller still owns it
-- (compare-and-PEXPIRE). A fill whose upstream call outlives the lease
-- renews it, so a slow but healthy fill keeps its right to publish, while a
-- crashed filler still blocks the key for at most one lease. The lease's
-- dependency record (lease_depends.lua) is extended with it while it is
-- this lease's.
--
-- KEYS[1]  lease key
-- KEYS[2]  the lease's dependency record key (lease key .. ':d')
-- ARGV[1]  lease value (owner@ticket, as lease.lua set it)
-- ARGV[2]  new TTL in milliseconds
--
-- Returns: 1 renewed, 0 not the owner (expired, or another filler holds it).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local record = redis.call('GET', KEYS[2])
if record and string.sub(record, 1, #ARGV[1] + 1) == ARGV[1] .. '\n' then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
