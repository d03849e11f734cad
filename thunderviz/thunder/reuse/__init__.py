"""Compile reuse: handing back thunder's earlier trace when the key matches (compile_reuse), the
key itself (key), and why a compile could not reuse one (why_not).
"""
