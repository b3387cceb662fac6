"""Boundary datasets on disk: the codecs, Lance I/O, per-row integrity, page-level reads, the decoded cache and
the bit-exact reader that training and evaluation use."""
