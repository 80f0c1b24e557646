-- ARGV: prefix, dep, replica, cap, ttl, n_held, held "member|lane"..., waiting members...
-- Returns {live replicas, this replica's rank, granted waiting members..., '#', lost waiting members...}
local dep, replica, cap, ttl, n_held = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
cleanup()
for i = 7, 6 + n_held do
  local m, lane = string.match(ARGV[i], '^(.*)|(.-)$')
  hold(m, lane, ttl)  -- renewed; re-added if it expired during a pause, for it still runs
end
local granted, lost = {}, {}
for i = 7 + n_held, #ARGV do
  local m = ARGV[i]
  if redis.call('ZSCORE', wexp, m) then
    redis.call('ZADD', wexp, now + ttl, m)
  elseif redis.call('ZSCORE', held, m) then
    table.insert(granted, m)
  else
    table.insert(lost, m)
  end
end
redis.call('ZADD', live, now + ttl, replica)
grant_next(cap, ttl, dep, '')
local replicas = redis.call('ZRANGE', live, 0, -1)
table.sort(replicas)  -- by name: every replica agrees on the ranks
local rank = 0
for i, r in ipairs(replicas) do if r == replica then rank = i - 1 end end
local out = {#replicas, rank}
for _, m in ipairs(granted) do table.insert(out, m) end
table.insert(out, '#')
for _, m in ipairs(lost) do table.insert(out, m) end
return out
