"""The demos: small models, the seed scenarios from plain Python, and the tutorial notebook with its headless runner.

    models       TinyGPT and make_batch: a GPT-shaped model and batches built from a seed (no downloads)
    scenarios    ``thunderviz demo --scenarios``: every way a model reaches a strategy, on fresh ranks, no Jupyter
    tutorial     ``thunderviz demo``: runs ``tutorial.ipynb`` (package data) in a real kernel, writes one report

Adding a tutorial section: a markdown cell with a numbered heading, then one ``%%thunder_fsdp``/``%%thunder_ddp``
cell with its own ``--name``, tagged ``nbval-ignore-output`` when its output varies (losses, timings). Every named
report lands in the demo's page and summary by itself; nbval runs the notebook first in ``./run test`` and
``tests/demos/test_installed_demo.py`` runs it once more as ``thunderviz demo`` from an installed package.

Nothing is imported here, so ``import thunderviz.demos`` costs nothing; import the module you need.
"""
