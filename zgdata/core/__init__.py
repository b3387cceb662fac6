"""The plumbing every room uses: atomic writes, locks, paths that stay inside the project, hashing, the runtime
(device, threads, determinism), progress bars, timing spans, test failpoints and the one Ray adapter."""
