"""The communication pass: distributing parameters in place (distribute), attaching a plan (setup), the trace
transform that buckets and places collectives (comm_pass) and its steps (gathers, reductions, zero3_saves, with the
operators they insert in ops and what they share in bucket_code), thunder's collective symbols (collectives),
gradient accumulation, and fusion regions cut at bucket boundaries.
"""
