"""Rank side: what runs inside each rank process (cheap to import: the kernel names the calls it sends).

calls (the names the kernel calls by apply), identity, setup (the process group), fabric, state, cell_hooks,
cell_phase (the compiling sub-phase), cell_targets, collect (one cell's ReportData), memory (each cell's
measured peak), timeline (--timeline on each rank; the kernel merges the recordings with it too).
"""
