"""The method, in plain PyTorch: what a step computes, whatever runs it.

Read ``examples/minimal_moco.py`` first: the whole algorithm on one screen (two views, the momentum update,
shuffled keys, the queue, InfoNCE), built from this package's parts; this package is that loop made general.

``protocol`` says what the trainer asks of a method and ``registry`` picks one for a config; ``moco`` (v1,
v2, v3) and ``negative_sources`` (memory bank, in-batch) are the methods; ``key_queue`` and
``queue_layouts`` hold MoCo's dictionary on one rank or across ranks; ``losses``, ``shuffle`` and
``batchnorm`` are the parts they are built from; ``collectives`` is all they say to other ranks. Nothing
here imports Ray or MLflow.
"""
