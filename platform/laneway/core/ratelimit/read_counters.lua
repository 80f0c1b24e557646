-- quota_used: the period counters named in KEYS, read in the hub's order (after the reserves sent before).
return redis.call('MGET', unpack(KEYS))
