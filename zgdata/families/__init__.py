"""Model families: one adapter per decoder architecture (``registry.family_of``), the capture of boundaries
through it, and the compute dtype a family runs in."""
