"""Slow, obviously-correct reference implementations every fast path is tested against.

One module per area: ``table`` (dict table), ``store`` (in-memory store), ``cache`` (LRU+LFU),
``comm`` (serial all-reduce), ``model`` (NumPy forward/backward by the book).
"""
