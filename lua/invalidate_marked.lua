-- invalidate_marked: invalidate.lua for an event that a feed delivers to
-- every instance (the fan-out, docs/invalidation.md), marked with its
-- position in the feed. The new generation carries the mark after an '@'.
-- A generation that already carries this mark, or for a stream mark
-- ('s:<ms>-<seq>') the mark of a later entry of the stream, was created
-- after this event was committed: it is left alone, so every delivery after
-- the first costs no cache miss.
--
-- KEYS[1]  generation key
-- ARGV[1]  nonce: caller's random token, makes the value unique
-- ARGV[2]  gen_ttl in milliseconds
-- ARGV[3]  mark ('s:<stream id>' or 'o:<outbox row id>:<created_at us>')
--
-- Returns: 1 replaced, 0 already covered by this or a later event.
-- Writes like invalidate.lua (DEL first: applied even at maxmemory).

-- a >= b for decimal strings without leading zeros (any length).
local function ge(a, b)
  if #a ~= #b then
    return #a > #b
  end
  return a >= b
end

local function covered(current, mark)
  local at = string.find(current, '@', 1, true)
  if not at then
    return false
  end
  local seen = string.sub(current, at + 1)
  if seen == mark then
    return true
  end
  local sm, ss = string.match(seen, '^s:(%d+)-(%d+)$')
  local mm, ms = string.match(mark, '^s:(%d+)-(%d+)$')
  if not (sm and mm) then
    return false
  end
  if sm ~= mm then
    return ge(sm, mm)
  end
  return ge(ss, ms)
end

local old = redis.call('GET', KEYS[1])
if old and covered(old, ARGV[3]) then
  return 0
end
redis.call('DEL', KEYS[1])
local t = redis.call('TIME')
-- Never equal to the old value: that one would carry this mark (covered).
local gen = string.format('%s.%06d-%s@%s', t[1], tonumber(t[2]), ARGV[1], ARGV[3])
redis.call('SET', KEYS[1], gen, 'PX', ARGV[2])
return 1
