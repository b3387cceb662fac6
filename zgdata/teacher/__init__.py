"""The teacher: prepared from a GGUF, a model directory or ``random:tiny*``, its digests, slices and tokenizer."""
