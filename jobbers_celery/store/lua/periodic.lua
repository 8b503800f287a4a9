-- periodic.lua: the beat watch's records (jobbers_celery/store/periodic.py), one schedule's
-- keys per call, each change atomic so that beat's publish, a worker's start and a
-- judgement racing each other count a run or slot once.
-- KEYS[1] the set of schedules, [2] the schedule's hash, [3] its runs (id -> JSON),
-- [4] its order (id by slot), [5] its running runs (id by start), [6] the runs whose
-- overlap waits for an earlier run's end (id by start).
-- ARGV[1] the operation, ARGV[2] the schedule's name, then the operation's arguments.
-- Times are the Redis clock's (ms); beat hands offsets from now, never its own clock. A
-- worker sends a start or an end later than it happened (its writer's thread, a store
-- outage waited out): it hands the event's age, and the event's time is now - age, the age
-- bounded to [0, the most an event may wait] (a clock oddity never moves it further).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, name = ARGV[1], ARGV[2]

local function read(id)
  local raw = redis.call('HGET', KEYS[3], id)
  if raw then
    return cjson.decode(raw)
  end
  return nil
end

local function write(run)
  redis.call('HSET', KEYS[3], run.id, cjson.encode(run))
end

local function trim(keep)
  local extra = redis.call('ZCARD', KEYS[4]) - keep
  if extra > 0 then
    -- zrange + zremrangebyrank, not zpopmin: the documented ACL rule grants these two
    local old = redis.call('ZRANGE', KEYS[4], 0, extra - 1)
    redis.call('ZREMRANGEBYRANK', KEYS[4], 0, extra - 1)
    for i = 1, #old do
      redis.call('HDEL', KEYS[3], old[i])
    end
  end
end

-- an event's time from its age (ARGV[i]) and the most it may be (ARGV[j])
local function at(age, most)
  return now - math.max(0, math.min(tonumber(age) or 0, tonumber(most)))
end

-- The overlap of a run X waits while a run that started before it is recorded running: its
-- end may be on its way. An end Y (eY, sY) flags each waiting X with sY <= sX <= eY (a
-- tie: the one recorded first is earlier); a waiting X older than `most` (no event waits
-- longer) whose earlier run is still recorded running is flagged, and one with no earlier
-- run left running is forgotten. Returns the ids flagged now.
local function settle(ended, s_end, e_end, most)
  local out = {}
  local waiting = redis.call('ZRANGE', KEYS[6], 0, -1, 'WITHSCORES')
  for i = 1, #waiting, 2 do
    local id, sx = waiting[i], tonumber(waiting[i + 1])
    local flag, done = false, false
    if ended and id ~= ended and s_end <= sx and sx <= e_end then
      flag, done = true, true
    else
      local earlier = 0
      for _, other in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', sx)) do
        if other ~= id then
          earlier = earlier + 1
        end
      end
      if earlier == 0 then
        done = true
      elseif sx < now - most then
        flag, done = true, true
      end
    end
    if done then
      redis.call('ZREM', KEYS[6], id)
    end
    if flag then
      local run = read(id)
      if run and not run.ovl then
        run.ovl = 1
        write(run)
        redis.call('HINCRBY', KEYS[2], 'overlap', 1)
        out[#out + 1] = id
      end
    end
  end
  return out
end

-- a schedule not in the set is watched only while the set has room
local function watched(max)
  if redis.call('ZSCORE', KEYS[1], name) then
    return true
  end
  return redis.call('ZCARD', KEYS[1]) < max
end

if op == 'learn' then
  -- ARGV[3] most schedules, [4] next slot's offset ('' unknown), [5...] field, value pairs
  if not watched(tonumber(ARGV[3])) then
    return 0
  end
  for i = 5, #ARGV, 2 do
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
  if ARGV[4] ~= '' then
    redis.call('HSET', KEYS[2], 'next_at', now + tonumber(ARGV[4]))
  end
  redis.call('HSET', KEYS[2], 'seen_at', now)
  redis.call('HDEL', KEYS[2], 'removed_at')
  redis.call('ZADD', KEYS[1], now, name)
  return 1
elseif op == 'remove' then
  -- beat no longer lists it: no more slots expected
  if redis.call('EXISTS', KEYS[2]) == 1 and not redis.call('HGET', KEYS[2], 'removed_at') then
    redis.call('HSET', KEYS[2], 'removed_at', now)
    redis.call('HDEL', KEYS[2], 'next_at')
    return 1
  end
  return 0
elseif op == 'publish' then
  -- ARGV[3] run id, [4] its slot's offset, [5] next slot's offset ('' unknown),
  -- [6] runs kept, [7] task name, [8] most schedules, [9] tolerance ms
  -- Returns 0 (not watched), 1, or 2 when a run a worker started first is late.
  if not watched(tonumber(ARGV[8])) then
    return 0
  end
  local slot = now + tonumber(ARGV[4])
  local run = read(ARGV[3])
  local out = 1
  if run then
    -- beat records its publish once the broker took it: a worker may have started it
    run.pub = math.min(now, run.start or now)
    run.slot = math.min(slot, run.pub)  -- each time is estimated: slot <= publish <= start
    if run.start and not run.late and run.start - run.slot > tonumber(ARGV[9]) then
      run.late = 1
      out = 2
      redis.call('HINCRBY', KEYS[2], 'late', 1)
    end
  else
    run = {id = ARGV[3], slot = slot, pub = now, state = 'published'}
    redis.call('HINCRBY', KEYS[2], 'runs', 1)
    redis.call('HSET', KEYS[2], 'last_state', 'published')
  end
  write(run)
  redis.call('ZADD', KEYS[4], run.slot, run.id)
  trim(tonumber(ARGV[6]))
  redis.call('HSET', KEYS[2], 'task', ARGV[7], 'last_pub', now)
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[2], 'next_at', now + tonumber(ARGV[5]))
  end
  redis.call('ZADD', KEYS[1], 'XX', now, name)
  return out
elseif op == 'start' then
  -- ARGV[3] run id, [4] runs kept, [5] tolerance ms, [6] a running run older than this
  -- is forgotten (its worker died), [7] task name, [8] most schedules, [9] the start's age
  -- (ms), [10] the most an event's age may be. Returns {watched, late, ids flagged
  -- overlapping now...}: this run's overlap is judged once the runs before it ended.
  if not watched(tonumber(ARGV[8])) then
    return {0, 0}
  end
  local id, most = ARGV[3], tonumber(ARGV[10])
  local started = at(ARGV[9], most)
  local run = read(id)
  if not run then  -- published by a beat without jobbers: no slot known
    run = {id = id, state = 'published'}
    redis.call('ZADD', KEYS[4], started, id)
    redis.call('HINCRBY', KEYS[2], 'runs', 1)
    redis.call('HSETNX', KEYS[2], 'task', ARGV[7])
    redis.call('HSETNX', KEYS[2], 'source', 'worker')
  end
  if run.start then  -- a redelivery of the same run: counted once
    return {1, 0}
  end
  run.start = started
  run.state = 'started'
  -- times estimated from other clocks and sends: keep slot <= publish <= start
  if run.pub and run.pub > started then
    run.pub = started
  end
  if run.slot and run.slot > (run.pub or started) then
    run.slot = run.pub or started
    redis.call('ZADD', KEYS[4], run.slot, id)
  end
  local late = 0
  if run.slot and not run.late and started - run.slot > tonumber(ARGV[5]) then
    run.late = 1
    late = 1
    redis.call('HINCRBY', KEYS[2], 'late', 1)
  end
  write(run)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - tonumber(ARGV[6]))
  redis.call('ZREM', KEYS[5], id)
  -- runs recorded before this one that started after it wait for this one's end too
  for _, other in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. started, '+inf')) do
    redis.call('ZADD', KEYS[6], 'NX', redis.call('ZSCORE', KEYS[5], other), other)
  end
  if #redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', started) > 0 then
    redis.call('ZADD', KEYS[6], started, id)
  end
  redis.call('ZADD', KEYS[5], started, id)
  trim(tonumber(ARGV[4]))
  redis.call('HSET', KEYS[2], 'last_start', started, 'last_state', 'started')
  local out = {1, late}
  for _, flagged in ipairs(settle(nil, 0, 0, most)) do
    out[#out + 1] = flagged
  end
  return out
elseif op == 'end' then
  -- ARGV[3] run id, [4] the state it ended in, [5] the end's age (ms), [6] the most an
  -- event's age may be. Returns the ids flagged overlapping now (they started before
  -- this end, after this run's start).
  local id, most = ARGV[3], tonumber(ARGV[6])
  local ended = at(ARGV[5], most)
  redis.call('ZREM', KEYS[5], id)
  local run = read(id)
  if not run then
    redis.call('ZREM', KEYS[6], id)
    return settle(nil, 0, 0, most)
  end
  if run.start and ended < run.start then  -- estimated: an end never precedes its start
    ended = run.start
  end
  run['end'] = ended
  run.state = ARGV[4]
  write(run)
  redis.call('HSET', KEYS[2], 'last_end', ended, 'last_state', ARGV[4])
  if run.start then
    return settle(id, run.start, ended, most)
  end
  return settle(nil, 0, 0, most)
elseif op == 'missed' then
  -- ARGV[3] judged_to the judge read ('' none), [4] runs kept, [5...] the missed slots
  -- (ascending). Compare-and-set on judged_to: of two judges, one records them.
  local judged = redis.call('HGET', KEYS[2], 'judged_to') or ''
  if judged ~= ARGV[3] or redis.call('HGET', KEYS[2], 'removed_at') then
    return 0
  end
  local n = 0
  for i = 5, #ARGV do
    local slot = tonumber(ARGV[i])
    local run = {id = 'missed:' .. ARGV[i], slot = slot, state = 'missed'}
    write(run)
    redis.call('ZADD', KEYS[4], slot, run.id)
    n = n + 1
  end
  trim(tonumber(ARGV[4]))
  redis.call('HSET', KEYS[2], 'judged_to', ARGV[#ARGV], 'last_state', 'missed')
  redis.call('HINCRBY', KEYS[2], 'missed', n)
  return n
elseif op == 'late' then
  -- ARGV[3] tolerance ms: flag the runs published and not started within it (once each)
  local since = tonumber(redis.call('HGET', KEYS[2], 'late_to') or '0')
  local upto = now - tonumber(ARGV[3])
  if upto <= since then
    return {}
  end
  local out = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. since, upto)) do
    local run = read(id)
    if run and run.pub and not run.start and not run.late then
      run.late = 1
      write(run)
      redis.call('HINCRBY', KEYS[2], 'late', 1)
      out[#out + 1] = id
    end
  end
  redis.call('HSET', KEYS[2], 'late_to', upto)
  return out
end
return redis.error_reply('periodic.lua: unknown operation ' .. tostring(op))
