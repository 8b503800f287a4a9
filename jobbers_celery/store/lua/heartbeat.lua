-- heartbeat.lua: a running attempt reports it is alive (and its progress and checkpoint).
-- Fenced: applies only while the task is started under the caller's attempt; a late report
-- from an attempt that was declared stalled is rejected and counted.
-- KEYS[1] task hash  KEYS[2] heartbeat-deadline index  KEYS[3] concurrency-lease set
-- KEYS[4] stats hash
-- ARGV[1] JSON {id, fence, progress?, ckpt?, lease_cap_ms?}  (progress, ckpt: JSON text)
-- Returns {1, cancel requested "1"|"", now_ms} or {0, state ("missing"), attempt, now_ms}
local now = redis_now()
local req = cjson.decode(ARGV[1])
local got = redis.call('HMGET', KEYS[1], 'state', 'attempt', 'hb_iv', 'cancel')
local attempt = tonumber(got[2] or '0') or 0
if got[1] ~= 'started' or attempt ~= tonumber(req.fence) then
  redis.call('HINCRBY', KEYS[4], 'rejected:heartbeat', 1)
  return {0, got[1] or 'missing', attempt, now}
end
local w = {'hb_at', now}
if req.progress then w[#w + 1] = 'progress'; w[#w + 1] = req.progress end
if req.ckpt then w[#w + 1] = 'ckpt'; w[#w + 1] = req.ckpt end
redis.call('HSET', KEYS[1], unpack(w))
local iv = tonumber(got[3] or '')
if iv then redis.call('ZADD', KEYS[2], now + iv, req.id) end
if req.lease_cap_ms then
  redis.call('ZADD', KEYS[3], 'XX', now + tonumber(req.lease_cap_ms), req.id)
end
return {1, got[4] and '1' or '', now}
