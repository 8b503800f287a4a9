-- lease.lua: take a lease that is free, or renew it for the token that holds it.
-- KEYS[1] the lease key; ARGV[1] the caller's token, ARGV[2] time to live in ms.
-- Returns 1 if the caller holds the lease now, 0 if another token does.
local holder = redis.call('GET', KEYS[1])
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
