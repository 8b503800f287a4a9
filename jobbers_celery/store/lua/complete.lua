-- complete.lua: one lifecycle step (see _lib.lua) and, only if it applied, Celery's result
-- write for the task, in one call. Used for `completed` when Celery's Redis result backend is
-- on the same server and db, so that completing a task costs no round trip of its own.
-- The write is what celery.backends.base.KeyValueStoreBackend._store_result followed by
-- RedisBackend._set does: keep a stored SUCCESS (deduplication), else SET the encoded meta
-- (with EX when expires > 0) and PUBLISH it on the same key for waiting AsyncResults.
-- The result may live in another db of the same server (jobbers' default layout: its records
-- on the broker's db, Celery's results on another): the write then SELECTs that db, which
-- affects this script only (Redis >= 2.8.12), never the caller's connection.
-- KEYS: shared layout, then task hash, Celery's result key.
-- ARGV[1] states order, ARGV[2] JSON spec, ARGV[3] encoded result meta (JSON),
-- ARGV[4] expires in seconds (0 = none), ARGV[5] the result's db ('' = this one).
-- Returns what transition.lua returns, then 1 if the result was written (or a stored SUCCESS
-- kept), 0 if not: a refused step writes no result, and a refused SELECT (an ACL without
-- it, Redis Cluster) leaves the write to Celery.
local ctx, k = context()
local out = step(ctx, KEYS[k], cjson.decode(ARGV[2]))
if out[1] ~= 1 then
  out[#out + 1] = 0
  return out
end
if ARGV[5] ~= '' then
  local ok = redis.pcall('SELECT', ARGV[5])
  if type(ok) == 'table' and ok.err then
    out[#out + 1] = 0
    return out
  end
end
out[#out + 1] = 1

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
