"""Exporting a zg student to deployable formats (stock transformers folders, GGUF)."""
