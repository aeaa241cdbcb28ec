-- unlock: release a fill lease only if we still own it, so a filler whose
-- lease expired cannot delete the lease of the filler that took over.
--
-- KEYS[1]  lease key
-- ARGV[1]  owner token
--
-- Returns: 1 deleted, 0 not the owner (or already gone).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
