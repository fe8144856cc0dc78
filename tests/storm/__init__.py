"""The randomized storms of the test suite: one workload, one record format, one checker.

The in-process storm (tests/test_invariants.py), the node-process storm
(tests/test_multiprocess.py) and the Ray storm (tests/test_ray_chaos.py) share:

- `records`: the calls, controls, crashes and executions a storm records (its `History`);
- `waves`: the seeded wave workload (in-process and node processes), and `clients`: the seeded
  client workload with retries on a dead node (Ray), each driving its cluster through a small
  adapter: `local` (LocalCluster), `nodes` (node processes), `ray` (router actors);
- `journal`: the in-process agent and its journal of executions (the node-process and Ray
  agents log theirs to Redis, and their adapters read them into the same records);
- `checker`: the one checker of the invariants over a history and the stores, with each
  environment's `rules.Rules`; its families of invariants in modules of their own: `verdicts`
  (the state and verdicts they share), `answers` (one answer per submit), `keys` (at most once
  per key), `loss` (nothing lost), `overlaps` (serialization, with the one overlap of turns the
  README allows: a holder kept from the store past its lease that commits nothing), `liveness`
  (no session unserved past a bound) and `streams` (stream completeness);
- `faults`: the fault storm's proxies and seeded fault driver, with its command-path stall wave;
- `known_bugs`: the stickless bugs the storms found, with the switches that turn their symptoms
  into listed known-bug hits.
"""
