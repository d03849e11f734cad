"""What a run reports, as picklable objects that open anywhere: run_report (RunReport, one cell on every
rank), strategy_table (compare_runs, the 'which strategy?' table), traffic (bytes within and between hosts).
render/ draws them; notebook/ shows them.
"""
