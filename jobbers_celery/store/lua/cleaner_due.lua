-- cleaner_due.lua: what one cleaner pass must look at, by the Redis clock; also ticks the clock.
-- Index-driven: O(log N + k) for k due entries.
-- KEYS[1] clock hash  KEYS[2] heartbeat-deadline index  KEYS[3] workers set
-- KEYS[4] cancelling set
-- ARGV[1] JSON {gap_ms, cgap_ms, lost_ms, limit}
-- Returns JSON {now, resumed_at, hb = ids past their deadline, dead = incarnations not seen
-- for lost_ms, cancel = terminate requests overdue (for tidying)}
local now = redis_now()
local req = cjson.decode(ARGV[1])
tick(KEYS[1], now, req.gap_ms, req.cgap_ms, false)
local limit = tonumber(req.limit)
return cjson.encode({
  now = now,
  resumed_at = tonumber(redis.call('HGET', KEYS[1], 'resumed_at') or '0') or 0,
  hb = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit),
  dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(req.lost_ms),
    'LIMIT', 0, limit),
  cancel = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - 60000, 'LIMIT', 0, limit),
})
