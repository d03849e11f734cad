"""Core: decisions, thunder hooks, trace model. Never imports IPython or ipywidgets."""
