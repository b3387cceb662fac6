"""Version of the boundary capture semantics.

Bump CAPTURE_VERSION whenever what a stored boundary *means* changes (which tensor is
captured, how it is cast). It is part of every boundary fingerprint, and the DVC
`materialize` stage depends on this file alone, so a bump reruns materialize while
unrelated code edits do not. `zg data verify` recomputes a sample bit for bit, so a
semantic change that forgot the bump fails loudly.
"""

CAPTURE_VERSION = 1

# Version of the boundary *storage format* (not of what the values mean): 2 added the
# per-row `checksum` column (zgdata/store/integrity.py). Written as `zg.format_version` in the
# schema metadata and checked on open; it is not part of the fingerprint, which identifies
# the values. Kept in this file so that a bump reruns the DVC materialize stage.
BOUNDARY_FORMAT_VERSION = 2
