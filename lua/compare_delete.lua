-- compare_delete: delete a key only if its value is still the one the caller
-- saw (e.g. a corrupt entry), so a fresh value written meanwhile survives.
--
-- KEYS[1]  key
-- ARGV[1]  expected value (bytes)
--
-- Returns: 1 deleted, 0 value differs or key missing.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
