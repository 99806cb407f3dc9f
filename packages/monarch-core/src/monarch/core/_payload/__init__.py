"""The payload wing: how values become bytes and buffers travel (pickling with
out-of-band buffers, torch tensors as buffers, upstream's Buffer, fresh memory to fill)."""
