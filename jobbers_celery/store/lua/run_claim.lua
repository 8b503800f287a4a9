-- run_claim.lua: claim the entries of a paced resubmit that its pace allows now.
-- KEYS (see RedisStore.run_keys): [1] run hash, [2] pending list, [3] unsettled zset,
-- [4] claiming zset. ARGV[1] most entries to claim.
-- Only a queued (moved to running here) or running run claims. Allowed now: one at once,
-- then rate per second since the run (re)started, less those claimed since. An entry leaves
-- the pending list in the same step that enters it as claimed: whoever calls this, however
-- many at once, an entry is handed out once. Returns the claimed members (task_id:attempt).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return {}
end
redis.call('HSET', KEYS[1], 'last_step_at', now)
if status == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', now, 'paced_since', now,
             'published_base', 0)
  status = 'running'
end
if status ~= 'running' then
  return {}
end
local rate = tonumber(redis.call('HGET', KEYS[1], 'rate'))
local since = tonumber(redis.call('HGET', KEYS[1], 'paced_since'))
local base = tonumber(redis.call('HGET', KEYS[1], 'published_base') or '0')
local claimed = tonumber(redis.call('HGET', KEYS[1], 'claimed') or '0')
local allowed = math.floor(rate * math.max(0, now - since) / 1000) + 1 - (claimed - base)
local n = math.min(allowed, tonumber(ARGV[1]))
local ids = {}
for _ = 1, n do
  local member = redis.call('LPOP', KEYS[2])
  if not member then
    break
  end
  ids[#ids + 1] = member
  redis.call('ZADD', KEYS[3], now, member)
  redis.call('ZADD', KEYS[4], now, member)
end
if #ids > 0 then
  redis.call('HINCRBY', KEYS[1], 'claimed', #ids)
end
return ids
