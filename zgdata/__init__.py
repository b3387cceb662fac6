"""zgdata: the teacher, token sets, boundary datasets, their lineage, inspect and verify.

zgdata knows nothing about students; zgtrain imports from it, never the other way round.
"""
