-- ARGV: prefix, dep, member, cap, ttl.  Returns 1 if it was held (and is now released), 0 if it
-- was still waiting (now removed), -1 if neither (expired).
local dep, m, cap, ttl = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local outcome = -1
if redis.call('ZSCORE', held, m) then
  unhold(m)
  outcome = 1
elseif redis.call('ZSCORE', wait, m) then
  unqueue(m)
  outcome = 0
end
cleanup()
grant_next(cap, ttl, dep, '')
return outcome
