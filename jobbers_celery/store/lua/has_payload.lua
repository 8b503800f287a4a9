-- has_payload.lua: for each task hash, its state, its attempt and whether it holds a payload
-- (field msg), without sending the payload back (the documented ACL rule has no HEXISTS).
-- KEYS: task hashes. Returns {state, attempt, 1 or 0} per key, flattened ('' when absent).
local out = {}
for _, task in ipairs(KEYS) do
  local got = redis.call('HMGET', task, 'state', 'attempt')
  out[#out + 1] = got[1] or ''
  out[#out + 1] = got[2] or ''
  out[#out + 1] = redis.call('HGET', task, 'msg') and 1 or 0
end
return out
