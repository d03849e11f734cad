"""Kernel side: the rank processes. Where they come from (a local cluster on loopback, an attached one, a
warm one started ahead), how they become ranks of one process group, and how they are kept and stopped.

engine (RankEngine), cluster, warm_pool, watchdog (orphan guard), spawn (run_ranks, as torchrun would),
topology (backend, hosts), rendezvous (how ranks find each other; the rank side reads it too).
"""
