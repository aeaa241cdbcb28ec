-- unlock: release a fill lease only if we still own it, so a filler whose
-- lease expired cannot delete the lease of the filler that took over. The
-- lease's dependency record (lease_depends.lua) goes with it.
--
-- KEYS[1]  lease key
-- KEYS[2]  the lease's dependency record key (lease key .. ':d')
-- ARGV[1]  lease value (owner@ticket)
--
-- Returns: 1 deleted, 0 not the owner (or already gone).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  return redis.call('DEL', KEYS[1])
end
return 0
