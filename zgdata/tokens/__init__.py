"""Corpus -> token set: the corpus readers, the tokenizer's batch encoder, packing into rows and the streamed
``data/tokens.lance`` writer with its lineage (``tokenset``)."""
