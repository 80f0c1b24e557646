"""Safe engine swaps: an alias's deployments play roles (serving, canary, shadow).

- pools.py: which pool (serving or canary) a request's session goes to, by a stable hash.
- watch.py: the canary's error rate and TTFT p99 against the serving pool's; past the margins,
  the canary is rolled back (its weight set to 0) by laneway itself.
- shadow.py: sampled copies of live requests run on the shadow deployment in the background,
  never answered; compare.py scores its answers against the served ones.
"""
