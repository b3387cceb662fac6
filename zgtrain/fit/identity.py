"""The resume check every trainer shares: a run folder's checkpoint resumes only a run of the same identity.

A run's identity is a dict of what decides its bits (versions, seed, config minus the keys that never change
them, the fingerprints of its inputs). meta.json records it beside each checkpoint. On a rerun the prior
meta.json must agree on every identity key; otherwise the run is refused with the keys that differ (a config
key as ``config.KEY``), unless the caller asked for a restart.
"""

from __future__ import annotations

from zgdata.errors import ZgError

__all__ = ["matches", "differences", "resumable"]


def matches(prior: dict, identity: dict) -> bool:
    """Whether ``prior`` (a meta.json) records this very run."""
    return {k: prior.get(k) for k in identity} == identity


def _flat(d: dict, keys) -> dict:
    return {
        **{k: d.get(k) for k in keys if k != "config"},
        **{f"config.{k}": v for k, v in (d.get("config") or {}).items()},
    }


def differences(prior: dict, identity: dict, limit: int = 4) -> str:
    """``key: old -> new`` for the first ``limit`` keys that differ, the config's as ``config.KEY``."""
    a, b = _flat(prior, identity), _flat(identity, identity)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k}: {str(a.get(k))[:40]} -> {str(b.get(k))[:40]}" for k in keys[:limit]) or "config"


def resumable(prior: dict | None, identity: dict, *, where: str, fix: str, auto: bool = False) -> dict | None:
    """``prior`` when it is a checkpoint of this run, None when there is none to resume.

    ``auto`` (zg repro) starts afresh instead of refusing: over a finished run or another run's checkpoint,
    as `dvc repro` does when it deletes a stale stage's outputs.
    """
    if prior is None:
        return None
    if auto and (prior.get("done") or not matches(prior, identity)):
        return None
    if not matches(prior, identity):
        raise ZgError(f"{where} holds a checkpoint of another run ({differences(prior, identity)})", fix=fix)
    return prior
