-- Shared by enqueue.lua, leave.lua and heartbeat.lua, which each begin with it.
-- KEYS: 1 held (zset member->expiry), 2 wait (zset member->score), 3 wexp (zset member->expiry),
--       4 meta (hash of counters), 5 live (zset replica->expiry)
local held, wait, wexp, meta, live = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local prefix = ARGV[1]
local function unqueue(m)
  local info = redis.call('HGET', meta, 'wm:' .. m)
  redis.call('ZREM', wait, m)
  redis.call('ZREM', wexp, m)
  if not info then return nil end
  redis.call('HDEL', meta, 'wm:' .. m)
  local lane, tid, w = string.match(info, '^(.-)|(.-)|(.*)$')
  redis.call('HINCRBY', meta, 'qd:' .. lane, -1)
  if redis.call('HINCRBY', meta, 'q:' .. lane .. ':' .. tid, -1) <= 0 then
    redis.call('HDEL', meta, 'q:' .. lane .. ':' .. tid)
    redis.call('HINCRBYFLOAT', meta, 'sw:' .. lane, -tonumber(w))
    redis.call('HINCRBY', meta, 'nt:' .. lane, -1)
  end
  return lane
end
local function unhold(m)
  local lane = redis.call('HGET', meta, 'hl:' .. m)
  if redis.call('ZREM', held, m) == 1 and lane then
    redis.call('HINCRBY', meta, 'run:' .. lane, -1)
  end
  redis.call('HDEL', meta, 'hl:' .. m)
end
local function hold(m, lane, ttl)
  if redis.call('ZADD', held, now + ttl, m) == 1 then
    redis.call('HINCRBY', meta, 'run:' .. lane, 1)
  end
  redis.call('HSET', meta, 'hl:' .. m, lane)
end
local function cleanup()
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', held, '-inf', now)) do unhold(m) end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', wexp, '-inf', now)) do unqueue(m) end
  redis.call('ZREMRANGEBYSCORE', live, '-inf', now)
end
-- Hand free slots to the head of the queue (skipping lanes at their cap); publish each grant
-- to the replica that owns the request, except `quiet` (the caller, who learns it directly).
local function grant_next(cap, ttl, dep, quiet)
  local granted = {}
  local free = cap - redis.call('ZCARD', held)
  local offset = 0
  while free > 0 do
    local batch = redis.call('ZRANGE', wait, offset, offset + 63, 'WITHSCORES')
    if #batch == 0 then break end
    local picked = false
    for i = 1, #batch, 2 do
      local m, score = batch[i], tonumber(batch[i + 1])
      local info = redis.call('HGET', meta, 'wm:' .. m)
      local lane = info and string.match(info, '^(.-)|') or nil
      local cfg = lane and redis.call('HGET', meta, 'cfg:' .. lane) or nil
      local lane_max = tonumber(cfg or '0') or 0
      local running = tonumber(redis.call('HGET', meta, 'run:' .. (lane or '')) or '0')
      if lane and running < lane_max then
        unqueue(m)
        local prio = math.floor(score / 1e12)
        redis.call('HSET', meta, 'V:' .. lane, tostring(score - prio * 1e12))
        hold(m, lane, ttl)
        table.insert(granted, m)
        if m ~= quiet then
          local replica = string.match(m, '^(.-):')
          redis.call('PUBLISH', prefix .. 'grant:' .. replica, dep .. '|' .. m)
        end
        free = free - 1
        picked = true
        break
      end
    end
    if not picked then offset = offset + 64 end
  end
  return granted
end
