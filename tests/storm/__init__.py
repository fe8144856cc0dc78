"""The randomized storms of the test suite: one workload, one journal format, one checker.

The in-process storm (tests/test_invariants.py), the node-process storm
(tests/test_multiprocess.py) and the Ray storm (tests/test_ray_chaos.py) record what they did in
the same records (`records`), drive their cluster through a small adapter (`waves`, `clients`)
and hand the run's history to the one `checker.Checker`. `known_bugs` lists the stickless bugs
the storms found, with the switches that turn their symptoms into listed known-bug hits.
"""
