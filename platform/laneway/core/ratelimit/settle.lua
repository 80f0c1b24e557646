-- The rate limiter's settle. KEYS as reserve.lua's (the reservation's periods). ARGV: request
-- id, tpm, tokens to give back, the key's tpm, tokens used, when it ended (the wall clock, as
-- the usage row's created_at), the epochs of the day's and the month's counter it was counted
-- in. A counter whose period is over has expired: it is not brought back. One begun again since
-- the reservation (Redis lost it) never held the reservation: nothing is given back to it, and
-- the tokens used are added when the request ended after the epoch (its usage row is after it,
-- so the rows the gateway adds - those before it - do not hold it); counter_recovery.py.
-- Money budgets (reserve.lua's KEYS[10 + j], KEYS[10 + m + j]): ARGV[9] the micro-units to give
-- back, ARGV[10] those spent, ARGV[11] how many budgets (m), then the epoch each was counted in;
-- given back and added as the token counters are.
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
local tpm, give, ktpm = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]) or 0
local used, ended = tonumber(ARGV[5]) or 0, tonumber(ARGV[6]) or 0
for i = 1, 2 do
  if redis.call('EXISTS', KEYS[6 + i]) == 1 then
    local epoch = redis.call('HGET', KEYS[8 + i], 'epoch') or ''
    if epoch == (ARGV[6 + i] or '') then
      if give > 0 and redis.call('DECRBY', KEYS[6 + i], give) < 0 then
        redis.call('SET', KEYS[6 + i], 0, 'KEEPTTL')
      end
    elseif used > 0 and epoch ~= '' then
      local began = tonumber(string.match(epoch, '^[^/]+'))
      if began and ended >= began then redis.call('INCRBY', KEYS[6 + i], used) end
    end
  end
end
local cgive, cused, m = tonumber(ARGV[9]) or 0, tonumber(ARGV[10]) or 0, tonumber(ARGV[11]) or 0
for j = 1, m do
  local ck = KEYS[10 + j]
  if redis.call('EXISTS', ck) == 1 then
    local epoch = redis.call('HGET', KEYS[10 + m + j], 'epoch') or ''
    if epoch == (ARGV[11 + j] or '') then
      if cgive > 0 and redis.call('DECRBY', ck, cgive) < 0 then redis.call('SET', ck, 0, 'KEEPTTL') end
    elseif cused > 0 and epoch ~= '' then
      local began = tonumber(string.match(epoch, '^[^/]+'))
      if began and ended >= began then redis.call('INCRBY', ck, cused) end
    end
  end
end
if give > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  local function refund(key, cap)
    local v = redis.call('HMGET', key, 'level', 'ts')
    local l, ts = tonumber(v[1]) or cap, tonumber(v[2]) or now
    l = math.min(cap, l + math.max(0, now - ts) * cap / 60 + give)
    redis.call('HSET', key, 'level', tostring(l), 'ts', tostring(now))
    redis.call('EXPIRE', key, 120)
  end
  if tpm > 0 then refund(KEYS[2], tpm) end
  if ktpm > 0 then refund(KEYS[5], ktpm) end
end
return 0
