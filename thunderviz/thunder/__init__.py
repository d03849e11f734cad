"""Everything that touches Lightning Thunder: the one package that imports ``thunder``.

The rest of thunderviz reads thunder through here (facts about a live object, the communication pass, trace capture,
the memory rehearsal and meters, compile reuse), so a thunder release that changes an internal changes one package.
Importing this package imports nothing of thunder's: each module loads it when used.
"""
