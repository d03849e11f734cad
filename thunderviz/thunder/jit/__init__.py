"""The jit decision's support: what the installed thunder offers (executors, keywords), what the
object handed to fabric.setup is (facts, front doors), and what thunder read when it ran (prologue).
"""
