"""The parallel decisions in plain Python: strategy options, the one decision table, buckets, the memory plan.

No thunder, no lightning, no torch devices: every decision is a pure function of facts and options, unit-tested
without processes, and read by the strategies, the notebook and the docs alike.
"""
