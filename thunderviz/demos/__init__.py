"""The demos: small models, the seed scenarios from plain Python, and the tutorial notebook with its headless runner.

    models       TinyGPT and make_batch: a GPT-shaped model and batches built from a seed (no downloads)
    scenarios    ``thunderviz demo --scenarios``: every way a model reaches a strategy, on fresh ranks, no Jupyter
    tutorial     ``thunderviz demo``: runs ``tutorial.ipynb`` (package data) in a real kernel, writes one report

Nothing is imported here, so ``import thunderviz.demos`` costs nothing; import the module you need.
"""
