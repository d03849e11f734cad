"""The notebook layer: IPython magics over ``thunderviz.ranks`` (imported only by ``%load_ext thunderviz``)."""
