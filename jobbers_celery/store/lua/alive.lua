-- alive.lua: a worker's main process says it is alive (every few seconds, from a thread).
-- Refreshes its liveness entry and the concurrency leases of the capped tasks it runs, ticks
-- the shared clock, and hands back the cancel(terminate=True) requests now due for tasks
-- it runs, so it can interrupt them, the tasks recorded as running here that it does
-- not run (orphans, see below), and the tasks it runs whose attempt the cleaner declared
-- stalled (halts, see below); it writes the notes the worker adds to such an attempt's
-- stall entry in the history (how it ended it).
-- KEYS[1] clock hash  KEYS[2] workers set  KEYS[3] this incarnation's worker-tasks set
-- KEYS[4] cancelling set  KEYS[5] this incarnation's halt hash  KEYS[6..] concurrency-lease
-- sets, one per lease in ARGV, then one task hash per note in ARGV, then (last) this
-- incarnation's not-running hash
-- ARGV[1] JSON {wid, gap_ms, cgap_ms, lease_cap_ms, leases = {id...}, running = {id...},
-- orphan_ms, orphan_grace_ms, notes = {{id, attempt, text}...}} (lease i uses KEYS[5 + i],
-- note j KEYS[5 + #leases + j]; running, notes and the orphan_ fields optional)
-- Returns {now_ms, {ids to interrupt}, {orphan ids}, {halt id, "<verdict ms>|<attempt>",
-- ...}}
local now = redis_now()
local req = cjson.decode(ARGV[1])
tick(KEYS[1], now, req.gap_ms, req.cgap_ms, true)
redis.call('ZADD', KEYS[2], now, req.wid)
for i, id in ipairs(req.leases) do
  redis.call('ZADD', KEYS[5 + i], 'XX', now + tonumber(req.lease_cap_ms), id)
end
local due = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 100)) do
  if redis.call('ZSCORE', KEYS[3], id) then
    redis.call('ZREM', KEYS[4], id)
    due[#due + 1] = id
  end
end
-- Tasks recorded as started here for longer than orphan_ms that the worker does not run:
-- the step that ended them was lost (a failover or restart lost the write). None within
-- orphan_grace_ms of the end of an outage (resumed_at): what the worker does not show may
-- still settle then (a start applied while its reply was lost to the outage, whose message
-- the worker gave back and which takes that start back when delivered; the held outcome of
-- a task the worker's pool runs without the worker knowing, sent again once the store
-- answers).
-- Whatever the grace, the same tasks are written in this incarnation's not-running hash
-- (id -> the start of that attempt, ms; rewritten every refresh): this worker's own word
-- that it does not run them, which lets a message it gave back take such a start back
-- (_lib.lua's step, spec.giver: the message's header alone never does).
local orphans = {}
local resumed = tonumber(redis.call('HGET', KEYS[1], 'resumed_at') or '0') or 0
local grace = tonumber(req.orphan_grace_ms or req.orphan_ms or '0') or 0
if req.orphan_ms then
  local notrun = KEYS[#KEYS]
  redis.call('DEL', notrun)
  local running = {}
  for _, id in ipairs(req.running) do running[id] = true end
  local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(req.orphan_ms),
    'WITHSCORES', 'LIMIT', 0, 100)
  for i = 1, #old, 2 do
    local id = old[i]
    if not running[id] then
      redis.call('HSET', notrun, id, old[i + 1])
      if now - resumed > grace then orphans[#orphans + 1] = id end
    end
  end
  if #old > 0 then redis.call('PEXPIRE', notrun, 2 * tonumber(req.orphan_ms) + 10000) end
end
-- Halts: the attempts stall.lua ended while this worker may still run them (frozen, or cut
-- off from Redis). Those it still runs are handed back every refresh until they end; the
-- others have ended: forgotten. (Read only when running is given: an old caller that
-- does not say what it runs forgets nothing.)
local halts = {}
if req.running then
  local marks = redis.call('HGETALL', KEYS[5])
  if #marks > 0 then
    local running = {}
    for _, id in ipairs(req.running) do running[id] = true end
    for i = 1, #marks, 2 do
      if running[marks[i]] then
        halts[#halts + 1] = marks[i]
        halts[#halts + 1] = marks[i + 1]
      else
        redis.call('HDEL', KEYS[5], marks[i])
      end
    end
  end
end
-- Notes: appended to the reason of the stall entry of that attempt in the task's history
-- (the newest such entry among the last 20), so the history tells how the attempt ended
-- without a transition of its own (stalled -> stalled is none).
for j, note in ipairs(req.notes or {}) do
  local task = KEYS[5 + #req.leases + j]
  local n = tonumber(redis.call('HGET', task, 'hn') or '0') or 0
  for i = n, math.max(1, n - 19), -1 do
    local e = redis.call('HGET', task, 'h' .. i)
    if e and string.sub(e, 1, 8) == 'stalled|' then
      local _, _, attempt = string.find(e, '^stalled|[^|]*|([^|]*)|')
      if attempt == tostring(note.attempt) then
        -- once, should a refresh whose reply was lost send it again
        if not string.find(e, note.text, 1, true) then
          redis.call('HSET', task, 'h' .. i, e .. '; ' .. note.text)
        end
        break
      end
    end
  end
end
return {now, due, orphans, halts}
