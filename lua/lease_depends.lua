-- lease_depends: record beside a fill lease what the fill depends on
-- besides its object's generation (its route's and its tags' tickets, taken
-- before its upstream call), so that a waiter's lease.lua supersedes the
-- fill once one of them moves instead of waiting for a publish that will be
-- refused. Written only while the caller owns the lease, with the lease's
-- remaining TTL.
--
-- KEYS[1]  lease key
-- KEYS[2]  the lease's dependency record key (lease key .. ':d')
-- ARGV[1]  lease value (owner@ticket, as lease.lua set it)
-- ARGV[2]  the record: ARGV[1], then one '<r|t> <key> <ticket>' line per
--          dependency (the format lease.lua reads)
--
-- Returns: 1 recorded, 0 not the owner (expired, or another filler holds it).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ttl)
return 1
