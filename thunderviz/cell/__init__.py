"""Kernel side: one cell across the ranks. What crosses to a rank and back (protocol), waiting for every
rank while streaming its output (driver, output), what a rank is doing (status), and what failed (failures,
tracebacks, numbers: a rank's traceback in the notebook's cell numbers).
"""
