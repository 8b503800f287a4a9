-- due.lua: which ids the scheduler should look at now, by the Redis clock.
-- KEYS: per shard scanned, [scheduled-state index (scored by run_at), publishing set
-- (deadlines)]: one shard per call on Redis Cluster (one slot), every shard in one call on
-- a single server (where slots do not matter).
-- ARGV[1] limit (per shard and kind)
-- Returns, per shard in KEYS order, {{due scheduled ids...}, {expired publishing ids...},
-- next run_at or ''}: nested arrays, never a separator in band (an id may hold any
-- character).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS, 2 do
  local nxt = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
  out[#out + 1] = {
    redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', now, 'LIMIT', 0, limit),
    redis.call('ZRANGEBYSCORE', KEYS[i + 1], '-inf', now, 'LIMIT', 0, limit),
    nxt[2] or '',
  }
end
return out
