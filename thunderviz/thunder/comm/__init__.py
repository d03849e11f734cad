"""The communication pass: distributing parameters in place (distribute), attaching a plan
(setup), the trace transform that buckets and places collectives (comm_pass), thunder's collective symbols
(collectives), gradient accumulation, and fusion regions cut at bucket boundaries.
"""
