"""The notebook layer: IPython magics over ``thunderviz.pool`` (imported only by ``%load_ext thunderviz``)."""
