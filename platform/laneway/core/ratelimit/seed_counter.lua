-- A quota counter seeded from the usage rows (counter_recovery.py), idempotently.
-- KEYS: a period's counter, its epoch hash. ARGV: the epoch the sum was taken for, the usage
-- rows' tokens in the period before it. -1: the counter is gone or began again (another epoch,
-- whose own seed counts); else the tokens added.
local e = redis.call('HMGET', KEYS[2], 'epoch', 'seeded')
if e[1] ~= ARGV[1] or redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local seeded, sum = tonumber(e[2]) or 0, tonumber(ARGV[2])
local add = sum - math.max(0, seeded)
if add > 0 then redis.call('INCRBY', KEYS[1], add) end
if add > 0 or seeded < 0 then redis.call('HSET', KEYS[2], 'seeded', ARGV[2]) end
return math.max(0, add)
