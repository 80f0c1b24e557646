-- The rate limiter's reserve: one atomic decision on Redis's clock (ratelimit/redis_limiter.py).
-- KEYS: the tenant's rpm, tpm, inflight; its API key's rpm, tpm, inflight; the tenant's token
-- counters of the current day and month, and each counter's epoch hash. ARGV: rpm, tpm, need,
-- maxc, request id, stale, the key's rpm, tpm, maxc, the day's and the month's quota (0: none),
-- each counter's TTL, the epoch a counter begun now gets (counter_recovery.py), and "1" for a
-- request already admitted by this replica (RedisRateLimiter.reserve_at_once): taken whatever
-- the limits say, so that the counters stay the true record of what was served.
-- Verdicts: 0 taken (then: the counters still to be seeded from the usage rows, bit 1 the
-- day's, 2 the month's; each counter's epoch; and the room each limit has left after this
-- request - the tenant's rpm, tpm, concurrency, the key's rpm, tpm, concurrency, the day's and
-- the month's quota - 0 for a limit not set: Headroom.answered); 1 tenant rate (wait ms);
-- 2 tenant concurrency; 3 key rate (wait ms); 4 key concurrency; 5 day quota, 6 month quota
-- (tokens used); 6 + j: money budget j (micro-units spent).
-- Money budgets (core/budgets.py), only those set: ARGV[16] the request's most cost, ARGV[17]
-- how many (m), then each one's limit and its counter's TTL; KEYS[10 + j] budget j's counter,
-- KEYS[10 + m + j] its epoch hash. Counted and begun as the token counters are; the reply
-- ends with their unseeded bits (1 << j-1) and epochs. ARGV[18 + 2m]: the soft threshold in
-- permille (0: off); a budget whose spend passes it is marked in its epoch hash, so the reply's
-- next bits (then each budget's spend) say it once per period, whichever replica sees it.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rpm, tpm, need = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local maxc, stale = tonumber(ARGV[4]), tonumber(ARGV[6])
local krpm, ktpm, kmaxc = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local quota = {tonumber(ARGV[10]), tonumber(ARGV[11])}
local admitted = ARGV[15] == '1'
local used = {0, 0}
for i = 1, 2 do
  if quota[i] > 0 then
    used[i] = tonumber(redis.call('GET', KEYS[6 + i]) or '0')
    if used[i] + need > quota[i] and not admitted then return {4 + i, used[i]} end
  end
end
local function level(key, cap)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local l, ts = tonumber(v[1]) or cap, tonumber(v[2]) or now
  return math.min(cap, l + math.max(0, now - ts) * cap / 60)
end
local function held(key)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - stale)
  return redis.call('ZCARD', key)
end
local cost, m = tonumber(ARGV[16] or '0'), tonumber(ARGV[17] or '0')
for j = 1, m do
  local spent = tonumber(redis.call('GET', KEYS[10 + j]) or '0')
  if spent + cost > tonumber(ARGV[17 + j]) and not admitted then return {6 + j, spent} end
end
local c, kc = 0, 0
if maxc > 0 then
  c = held(KEYS[3])
  if c >= maxc and not admitted then return {2, 1000} end
end
if kmaxc > 0 then
  kc = held(KEYS[6])
  if kc >= kmaxc and not admitted then return {4, 1000} end
end
local function waits(rk, tk, r, tt)
  local wait, lr, lt = 0, 0, 0
  if r > 0 then
    lr = level(rk, r)
    if lr < 1 then wait = math.max(wait, (1 - lr) * 60 / r) end
  end
  if tt > 0 then
    lt = level(tk, tt)
    if lt < need then wait = math.max(wait, (need - lt) * 60 / tt) end
  end
  return wait, lr, lt
end
local wait, lr, lt = waits(KEYS[1], KEYS[2], rpm, tpm)
local kwait, klr, klt = waits(KEYS[4], KEYS[5], krpm, ktpm)
if not admitted then
  if kwait > wait then return {3, math.ceil(kwait * 1000)} end
  if wait > 0 then return {1, math.ceil(wait * 1000)} end
end
local function store(key, l)
  redis.call('HSET', key, 'level', tostring(l), 'ts', tostring(now))
  redis.call('EXPIRE', key, 120)
end
if rpm > 0 then store(KEYS[1], lr - 1) end
if tpm > 0 then store(KEYS[2], lt - need) end
if krpm > 0 then store(KEYS[4], klr - 1) end
if ktpm > 0 then store(KEYS[5], klt - need) end
if maxc > 0 then redis.call('ZADD', KEYS[3], now, ARGV[5]); redis.call('EXPIRE', KEYS[3], stale) end
if kmaxc > 0 then redis.call('ZADD', KEYS[6], now, ARGV[5]); redis.call('EXPIRE', KEYS[6], stale) end
local unseeded, epochs = 0, {}
for i = 1, 2 do
  -- every tenant is counted (admins see it; a quota set mid-month applies to the month's use)
  if redis.call('EXISTS', KEYS[6 + i]) == 0 then
    -- a new period, or Redis lost the counter: begin it; the gateway adds the usage rows
    redis.call('SET', KEYS[6 + i], need, 'EX', ARGV[11 + i])
    local epoch = ARGV[14] .. '/' .. t[1] .. '.' .. t[2]  -- unique even on a frozen wall clock
    redis.call('HSET', KEYS[8 + i], 'epoch', epoch, 'seeded', -1)
    redis.call('EXPIRE', KEYS[8 + i], ARGV[11 + i])
    unseeded, epochs[i] = unseeded + i, epoch
  else
    redis.call('INCRBY', KEYS[6 + i], need)
    local e = redis.call('HMGET', KEYS[8 + i], 'epoch', 'seeded')
    epochs[i] = e[1] or ''
    if e[1] and e[2] == '-1' then unseeded = unseeded + i end
  end
end
-- what is left of each limit once this request is counted (a replica admits at once within it)
local reply = {0, unseeded, epochs[1], epochs[2], math.floor(lr - 1), math.floor(lt - need), maxc - c - 1,
               math.floor(klr - 1), math.floor(klt - need), kmaxc - kc - 1, quota[1] - used[1] - need,
               quota[2] - used[2] - need}
local bits, bunseeded, bepochs = {1, 2, 4, 8}, 0, {}
for j = 1, m do
  local ck, ek, ttl = KEYS[10 + j], KEYS[10 + m + j], ARGV[17 + m + j]
  if redis.call('EXISTS', ck) == 0 then
    redis.call('SET', ck, cost, 'EX', ttl)
    local epoch = ARGV[14] .. '/' .. t[1] .. '.' .. t[2]
    redis.call('HSET', ek, 'epoch', epoch, 'seeded', -1)
    redis.call('EXPIRE', ek, ttl)
    bunseeded, bepochs[j] = bunseeded + bits[j], epoch
  else
    redis.call('INCRBY', ck, cost)
    local e = redis.call('HMGET', ek, 'epoch', 'seeded')
    bepochs[j] = e[1] or ''
    if e[1] and e[2] == '-1' then bunseeded = bunseeded + bits[j] end
  end
end
reply[13] = bunseeded
for j = 1, m do reply[13 + j] = bepochs[j] end
local soft, crossed = tonumber(ARGV[18 + 2 * m] or '0'), 0
for j = 1, m do
  local after = tonumber(redis.call('GET', KEYS[10 + j]) or '0')
  reply[14 + m + j] = after
  if soft > 0 and after * 1000 >= soft * tonumber(ARGV[17 + j])
      and redis.call('HSETNX', KEYS[10 + m + j], 'alerted', 1) == 1 then
    crossed = crossed + bits[j]
  end
end
if m > 0 then reply[14 + m] = crossed end
return reply
