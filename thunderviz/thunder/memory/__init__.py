"""Memory: a strategy's step rehearsed on the meta device (rehearsal, meta_model, meta_world, relayout,
storage_tracker), a real step's measured peak (meter), and thunder's saved tensors against eager's.
"""
