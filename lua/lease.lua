-- lease: take the fill lease of one object variant together with the
-- fill's ticket (the current generation, created fresh if missing, as in
-- ticket.lua). A lease held by a fill that can never publish is superseded:
-- waiting for it would hand readers an answer fetched before an
-- invalidation (docs/architecture.md#no-older-answer-after-an-invalidation).
-- That is a fill whose ticket is no longer the current generation, or one
-- whose recorded dependencies (lease_depends.lua: its route's and its tags'
-- tickets) are no longer all current.
--
-- KEYS[1]  lease key
-- KEYS[2]  generation key
-- KEYS[3]  the lease's dependency record key (lease key .. ':d')
-- KEYS[4..] (single node) the generation keys the record in ARGV[5] lists,
--          in its order: the script compares them with the record's tickets
-- ARGV[1]  owner token (never contains '@')
-- ARGV[2]  nonce: caller's random token, for a fresh generation
-- ARGV[3]  lease TTL in milliseconds
-- ARGV[4]  gen_ttl in milliseconds (refreshed on every call)
-- ARGV[5]  optional: the record a previous reply returned ('' none); its
--          dependencies are checked only if it is still the record
-- ARGV[6]  optional (Redis Cluster, where those keys live in other slots):
--          the 1-based index of a dependency of that record the caller
--          found moved ('' none). A generation never returns to a value it
--          had, so a moved one found before this call is still moved.
--
-- The lease's value is '<owner>@<ticket>'; publish, renew and unlock
-- compare the whole value. The record is '<lease value>' then one line
-- '<r|t> <key> <ticket>' per dependency (r: the route, t: a tag).
-- Returns: {1, ticket, ''} won, the lease was free
--          {2, ticket, ''} won, a fill of an older generation was superseded
--          {3, ticket, ''} won, a fill whose route generation moved was superseded
--          {4, ticket, ''} won, a fill one of whose tags moved was superseded
--          {0, ticket, record} held by a fill of the current generation:
--          wait; record is its dependency record ('' when it has none), for
--          the next call's ARGV[5]
-- The first write is a SET (lease or new generation): at maxmemory with
-- noeviction Redis refuses it, and the fill takes the degraded path, as a
-- store that refuses writes should make it (PEXPIRE first would let the
-- script write on).
local gen = redis.call('GET', KEYS[2])
local existed = gen
if not gen then
  local t = redis.call('TIME')
  gen = string.format('%s.%06d-%s', t[1], tonumber(t[2]), ARGV[2])
  redis.call('SET', KEYS[2], gen, 'PX', ARGV[4])
end
local code = 1
local held = redis.call('GET', KEYS[1])
if held then
  local at = string.find(held, '@', 1, true)
  code = 2
  if at and string.sub(held, at + 1) == gen then
    code = 0
    local record = redis.call('GET', KEYS[3])
    if not record or string.sub(record, 1, #held + 1) ~= held .. '\n' then
      record = ''
    end
    if record ~= '' and record == ARGV[5] then
      local moved = tonumber(ARGV[6] or '')
      local i = 0
      for line in string.gmatch(string.sub(record, #held + 2), '[^\n]+') do
        i = i + 1
        local kind, key, ticket = string.match(line, '^(%a) (.+) (%S+)$')
        if not kind then
          break
        end
        if moved == nil and KEYS[3 + i] == key and redis.call('GET', key) ~= ticket then
          moved = i
        end
        if moved == i then
          code = (kind == 'r') and 3 or 4
          break
        end
      end
    end
    if code == 0 then
      if existed then
        redis.call('PEXPIRE', KEYS[2], ARGV[4])
      end
      return {0, gen, record}
    end
  end
end
redis.call('SET', KEYS[1], ARGV[1] .. '@' .. gen, 'PX', ARGV[3])
redis.call('DEL', KEYS[3])
if existed then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return {code, gen, ''}
