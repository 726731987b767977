"""What touches DDP itself: the engine that runs each bucket's all-reduce, the events and timings
it emits, rebuilding DDP's reducer (unhooking, bucket sizes) and the guard on DDP's own collectives.
"""
