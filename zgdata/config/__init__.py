"""Typed views of the params.yaml sections that zgdata owns, and the machinery every section uses.

One keyword-only frozen dataclass per section. Each field is declared with ``param()``:
its default, its documentation (``zg params`` prints it) and its allowed range. Defaults
live only here (and in zgtrain/project/config.py and sections.py for zgtrain's); profiles and params.yaml
are generated from them. ``Section.__post_init__`` coerces values where YAML is ambiguous
(``1e-3`` is read as a string) and refuses every other wrong type or out-of-range value
with one line naming the key, the value and what is allowed.

The package's modules: ``base`` (``param``, ``Section``, reading params.yaml), ``corpus`` (``corpus:``,
``sample:``) and ``sections`` (``teacher:``, ``partition:``, ``materialize:``, ``verify:``). Import from the
package: ``from zgdata.config import MaterializeConfig, section``.
"""

from zgdata.config.base import (
    DTYPES,
    MAX_BATCH,
    MAX_STEPS,
    ProjectKind,
    Section,
    check_field,
    check_int,
    defaults,
    describe,
    load_params,
    param,
    project_kind,
    rekeyed,
    section,
)
from zgdata.config.corpus import SAMPLE_SOURCE, CorpusConfig, MixPart, SampleConfig
from zgdata.config.sections import BlockSpec, MaterializeConfig, PartitionConfig, TeacherConfig, VerifyConfig

__all__ = [
    "Section",
    "param",
    "TeacherConfig",
    "CorpusConfig",
    "MixPart",
    "SampleConfig",
    "SAMPLE_SOURCE",
    "PartitionConfig",
    "BlockSpec",
    "MaterializeConfig",
    "VerifyConfig",
    "load_params",
    "section",
    "describe",
    "defaults",
    "check_int",
    "check_field",
    "rekeyed",
    "DTYPES",
    "MAX_STEPS",
    "MAX_BATCH",
    "ProjectKind",
    "project_kind",
]
