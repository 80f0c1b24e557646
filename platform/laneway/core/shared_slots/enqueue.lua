-- ARGV: prefix, dep, member, lane, priority, lane_max, depth_limit, tenant, weight, cost, ttl, cap,
--       service_s, timeout_s
local dep, m, lane = ARGV[2], ARGV[3], ARGV[4]
local prio, lane_max, depth_limit = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local tid, w, cost = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])
local ttl, cap, service, timeout = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
cleanup()
redis.call('HSET', meta, 'cfg:' .. lane, lane_max)
local mine = tonumber(redis.call('HGET', meta, 'q:' .. lane .. ':' .. tid) or '0')
local depth = tonumber(redis.call('HGET', meta, 'qd:' .. lane) or '0')
local others = tonumber(redis.call('HGET', meta, 'nt:' .. lane) or '0') - (mine > 0 and 1 or 0)
local sw = tonumber(redis.call('HGET', meta, 'sw:' .. lane) or '0') + (mine > 0 and 0 or w)
local share = math.max(1, depth_limit * w / sw)
if others > 0 and mine >= share then return {'refused', 'tenant_queue_share', tostring(share), tostring(mine)} end
if depth >= depth_limit then return {'refused', 'queue_full', tostring(depth), '0'} end
local V = tonumber(redis.call('HGET', meta, 'V:' .. lane) or '0')
local F = tonumber(redis.call('HGET', meta, 'F:' .. lane .. ':' .. tid) or '0')
local start = math.max(V, F)
local score = prio * 1e12 + start
local ahead = redis.call('ZCOUNT', wait, '-inf', '(' .. score)
local free = math.min(cap - redis.call('ZCARD', held),
                      lane_max - tonumber(redis.call('HGET', meta, 'run:' .. lane) or '0'))
if service > 0 and ahead >= free then
  local wait_s = (ahead - math.max(free, 0) + 1) * service / math.max(1, math.min(lane_max, cap))
  if wait_s > timeout then return {'refused', 'predicted_wait_exceeded', tostring(wait_s), '0'} end
end
redis.call('HSET', meta, 'F:' .. lane .. ':' .. tid, tostring(start + cost / w))
redis.call('ZADD', wait, score, m)
redis.call('ZADD', wexp, now + ttl, m)
redis.call('HSET', meta, 'wm:' .. m, lane .. '|' .. tid .. '|' .. w)
redis.call('HINCRBY', meta, 'qd:' .. lane, 1)
if redis.call('HINCRBY', meta, 'q:' .. lane .. ':' .. tid, 1) == 1 then
  redis.call('HINCRBYFLOAT', meta, 'sw:' .. lane, w)
  redis.call('HINCRBY', meta, 'nt:' .. lane, 1)
end
for _, g in ipairs(grant_next(cap, ttl, dep, m)) do
  if g == m then return {'granted', '', '0', '0'} end
end
return {'queued', '', tostring(ahead), '0'}
