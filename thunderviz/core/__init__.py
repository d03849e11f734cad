"""Old import paths, kept so scripts written against thunderviz 0.1's ``thunderviz.core`` keep working.

``core`` was split by concern (README, "Architecture"): ``thunderviz.trace`` (the trace model, files, ledger, diff),
``thunderviz.timeline``, ``thunderviz.parallel`` (options, decisions, buckets) and ``thunderviz.thunder`` (the only
package that imports thunder). Only the paths the README documented are kept here; new code imports the new ones.
"""
