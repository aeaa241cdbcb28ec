-- lease_renew: extend a fill lease only while the caller still owns it
-- (compare-and-PEXPIRE). A fill whose upstream call outlives the lease
-- renews it, so a slow but healthy fill keeps its right to publish, while a
-- crashed filler still blocks the key for at most one lease.
--
-- KEYS[1]  lease key
-- ARGV[1]  lease value (owner@ticket, as lease.lua set it)
-- ARGV[2]  new TTL in milliseconds
--
-- Returns: 1 renewed, 0 not the owner (expired, or another filler holds it).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
