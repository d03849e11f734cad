"""Checkpoints for models our strategies sharded (FSDP) or replicated (DDP) in place: ``save_load`` (``fabric.save``
/ ``fabric.load``: which format, which checks), ``full`` (one ``torch.save`` file), ``sharded`` (a PyTorch
Distributed Checkpoint directory), ``state`` (what both read of the state, and how both write safely).
"""
