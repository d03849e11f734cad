"""Capture: thunder's traces read into the trace model (traces), one trace frozen (snapshot),
its parameters named (param_names), and which jitted object traced a module (find_target).
"""
