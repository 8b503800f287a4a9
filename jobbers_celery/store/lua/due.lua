-- due.lua: which ids the scheduler should look at now, by the Redis clock.
-- KEYS[1] scheduled-state index (scored by run_at)   KEYS[2] publishing set (deadlines)
-- ARGV[1] limit
-- Returns {due scheduled ids..., '|', expired publishing ids..., '|', next run_at or ''}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local out = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
out[#out + 1] = '|'
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)) do
  out[#out + 1] = id
end
out[#out + 1] = '|'
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
out[#out + 1] = nxt[2] or ''
return out
