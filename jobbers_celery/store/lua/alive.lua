-- alive.lua: a worker's main process says it is alive (every few seconds, from a thread).
-- Refreshes its liveness entry and the concurrency leases of the capped tasks it runs, ticks
-- the shared clock, and hands back the cancel(terminate=True) requests now due for tasks
-- it runs, so it can interrupt them.
-- KEYS[1] clock hash  KEYS[2] workers set  KEYS[3] this incarnation's worker-tasks set
-- KEYS[4] cancelling set  KEYS[5..] concurrency-lease sets, one per lease in ARGV
-- ARGV[1] JSON {wid, gap_ms, cgap_ms, lease_cap_ms, leases = {id...}} (lease i uses KEYS[4 + i])
-- Returns {now_ms, ids to interrupt...}
local now = redis_now()
local req = cjson.decode(ARGV[1])
tick(KEYS[1], now, req.gap_ms, req.cgap_ms, true)
redis.call('ZADD', KEYS[2], now, req.wid)
for i, id in ipairs(req.leases) do
  redis.call('ZADD', KEYS[4 + i], 'XX', now + tonumber(req.lease_cap_ms), id)
end
local out = {now}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 100)) do
  if redis.call('ZSCORE', KEYS[3], id) then
    redis.call('ZREM', KEYS[4], id)
    out[#out + 1] = id
  end
end
return out
