-- complete.lua: one lifecycle step (see _lib.lua) and, only if it applied, Celery's result
-- write for the task, in one call. Used for `completed` when Celery's Redis result backend is
-- on the same server and db, so that completing a task costs no round trip of its own.
-- The write is what celery.backends.base.KeyValueStoreBackend._store_result followed by
-- RedisBackend._set does: keep a stored SUCCESS (deduplication), else SET the encoded meta
-- (with EX when expires > 0) and PUBLISH it on the same key for waiting AsyncResults.
-- KEYS: shared layout, then task hash, Celery's result key.
-- ARGV[1] states order, ARGV[2] JSON spec, ARGV[3] encoded result meta (JSON),
-- ARGV[4] expires in seconds (0 = none).
-- Returns what transition.lua returns; a refused step writes no result.
local ctx, k = context()
local out = step(ctx, KEYS[k], cjson.decode(ARGV[2]))
if out[1] ~= 1 then return out end

local rkey = KEYS[k + 1]
local stored = redis.call('GET', rkey)
if stored then
  local ok, meta = pcall(cjson.decode, stored)
  if ok and type(meta) == 'table' and meta.status == 'SUCCESS' then return out end
end
local expires = tonumber(ARGV[4]) or 0
if expires > 0 then
  redis.call('SET', rkey, ARGV[3], 'EX', expires)
else
  redis.call('SET', rkey, ARGV[3])
end
redis.call('PUBLISH', rkey, ARGV[3])
return out
