-- bloom_check: three-state membership test (docs/architecture.md#bloom-filter).
-- Only a complete filter built with our parameters may say "certainly absent".
--
-- KEYS[1]  bits  (the active bitmap)
-- KEYS[2]  ready (holds the signature of the active bitmap)
-- ARGV[1]  signature expected by the caller (algorithm, m, k, format)
-- ARGV[2]  m: bits in the bitmap (a shorter bitmap is damaged: unknown)
-- ARGV[3..] the element's bit positions
--
-- Returns:  0 certainly absent (some bit is 0)
--           1 maybe present (all bits are 1)
--          -1 unknown: no ready, signature differs, bitmap missing or short
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
if redis.call('STRLEN', KEYS[1]) * 8 < tonumber(ARGV[2]) then
  return -1
end
for i = 3, #ARGV do
  if redis.call('GETBIT', KEYS[1], ARGV[i]) == 0 then
    return 0
  end
end
return 1
