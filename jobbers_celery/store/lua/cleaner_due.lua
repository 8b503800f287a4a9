-- cleaner_due.lua: what one cleaner pass must look at, by the Redis clock; also ticks the
-- clock. Index-driven: O(log N + k) for k due entries.
-- KEYS: per shard scanned, [clock hash, heartbeat-deadline index, workers set, cancelling
-- set]: one shard per call on Redis Cluster (one slot), every shard in one call on a single
-- server (where slots do not matter), so that a pass with nothing to do costs one call.
-- ARGV[1] JSON {gap_ms, cgap_ms, lost_ms, limit}
-- Returns a JSON array, one object per shard in KEYS order: {now, resumed_at, hb = ids past
-- their deadline, dead = incarnations not seen for lost_ms, cancel = terminate requests
-- overdue (for tidying)}
local now = redis_now()
local req = cjson.decode(ARGV[1])
local limit = tonumber(req.limit)
local out = {}
for i = 1, #KEYS, 4 do
  local clock, hbdue, workers, cancelling = KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3]
  tick(clock, now, req.gap_ms, req.cgap_ms, false)
  out[#out + 1] = {
    now = now,
    resumed_at = tonumber(redis.call('HGET', clock, 'resumed_at') or '0') or 0,
    hb = redis.call('ZRANGEBYSCORE', hbdue, '-inf', now, 'LIMIT', 0, limit),
    dead = redis.call('ZRANGEBYSCORE', workers, '-inf', now - tonumber(req.lost_ms),
      'LIMIT', 0, limit),
    cancel = redis.call('ZRANGEBYSCORE', cancelling, '-inf', now - 60000, 'LIMIT', 0, limit),
  }
end
return cjson.encode(out)
