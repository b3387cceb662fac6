"""Tiny teachers and student folders, built by the production code without a project.

``tiny_family_teacher``: a family's tiny random teacher (``zgdata.teacher.prepare.tiny_teacher``:
``random:tiny-<family>``). ``make_student`` (the export tests: test_gguf.py, test_hf.py, test_export_target.py)
cuts it to some of its layers, their MLPs pruned to their first channels (``Family.prune_mlp``), and the renumbered
state goes through ``student_model`` and ``write_student_files`` (zgtrain/student/assemble.py), the functions
``build_from_blocks`` and ``save_student`` use; then ``record_checksums``. That skips the project (tokens,
boundaries, trained blocks) and the model card, which export never needs. ``make_moe_student`` does the same for a
mixture-of-experts family, with each layer's experts pruned (``MoeFamily.prune_experts``) or merged into one.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["tiny_family_teacher", "teacher_layers", "make_student", "make_moe_student", "student_logits"]


def tiny_family_teacher(name: str):
    """Family ``name``'s tiny random teacher (zgdata/teacher/prepare.py), in eval mode."""
    from zgdata.teacher.prepare import tiny_teacher

    model, _ = tiny_teacher(name)
    return model.eval()


def teacher_layers(model, name: str, layers) -> dict:
    """What a conversion starts from: the teacher tensors of ``layers``, keyed ``layers.{i}.*`` as the slices are."""
    from zgdata.families.registry import family_of

    per_layer, _ = family_of(model.config).split_state(model.state_dict())
    return {f"layers.{i}.{k}": v for i in layers for k, v in per_layer[i].items()}


def make_student(
    folder: Path,
    name: str,
    widths: list,
    windows: list | None = None,
    keep: list | None = None,
    *,
    tie=False,
    config: dict | None = None,
):
    """A student folder of family ``name`` at ``folder``: teacher layers ``keep`` (default the first len(widths))
    with MLP widths ``widths`` and zg windows ``windows`` (default none); ``tie``: the LM head tied to the
    embeddings (set on the teacher config, its own head weight dropped), as released Gemma 2 models are.
    ``config``: fields set on the tiny teacher's config before it is built (as ``make_moe_student``'s)."""
    import torch

    from zgdata.families.registry import family_of
    from zgdata.teacher.prepare import tiny_teacher
    from zgtrain.student.assemble import needs_modeling_code, student_model, write_student_files
    from zgtrain.student.load import record_checksums

    teacher, tok = _configured(*tiny_teacher(name), config)
    fam = family_of(teacher.config)
    layers, head = fam.split_state(teacher.state_dict())
    keep = keep or list(range(len(widths)))
    windows = windows or [None] * len(widths)
    config = teacher.config.to_dict()
    if tie:
        config["tie_word_embeddings"] = True
        head.pop("lm_head.weight")
    state = {fam.head_key(k): v for k, v in head.items()}
    for i, (src, w) in enumerate(zip(keep, widths, strict=True)):
        for k, v in fam.prune_mlp(layers[src], torch.arange(w)).items():
            state[fam.layer_key(i, k)] = v
    types = fam.layer_types(teacher.config, keep)
    model = student_model(config, state, widths, windows, types, dtype=torch.float32)
    summary = {
        "family": name,
        "intermediate_sizes": widths,
        "layer_windows": windows,
        "remote_code": needs_modeling_code(widths, windows),
        "layers": len(widths),
    }
    write_student_files(folder, model, summary, tok, teacher_sha256="0" * 64)
    record_checksums(folder)
    return folder


def _configured(teacher, tok, config: dict | None):
    """The tiny teacher rebuilt with ``config``'s fields set (its weights follow the fields: a bias flag adds biases)."""
    import torch

    if config:
        cfg = teacher.config
        for key, value in config.items():
            setattr(cfg, key, value)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(20240601)
            teacher = type(teacher)(cfg).eval()
    return teacher, tok


def make_moe_student(
    folder: Path, name: str, experts: list, top_k: list, keep: list, *, config: dict | None = None
) -> Path:
    """A mixture-of-experts student folder of family ``name``: teacher layers ``keep``, layer i with its teacher's
    first ``experts[i]`` experts running ``top_k[i]`` each, or (``experts[i]`` = 0) one expert made of the first
    ``top_k[i]`` experts' channels side by side under router row 0, as moe_to_dense's students are (one expert of
    top-k experts' width, top-1). ``config``: fields set on the tiny teacher's config before it is built (its
    weights follow: a ``num_key_value_heads`` of its own gets k/v projections of that size)."""
    import torch

    from zgdata.families.registry import family_of
    from zgdata.teacher.prepare import tiny_teacher
    from zgtrain.student.assemble import needs_modeling_code, student_model, write_student_files
    from zgtrain.student.load import record_checksums

    teacher, tok = _configured(*tiny_teacher(name), config)
    fam = family_of(teacher.config)
    layers, head = fam.split_state(teacher.state_dict())
    state = {fam.head_key(k): v for k, v in head.items()}
    widths, counts, active = [], [], []
    for i, (src, n, k) in enumerate(zip(keep, experts, top_k, strict=True)):
        layer = dict(layers[src])
        if n:
            layer = fam.prune_experts(layer, torch.arange(n))
            widths.append(fam.width(teacher.config))
        else:  # one expert: experts 0..k-1's channels (gate rows, up rows, down columns) under router row 0
            up, down = layer["mlp.experts.gate_up_proj"][:k], layer["mlp.experts.down_proj"][:k]
            half = up.shape[1] // 2
            layer["mlp.experts.gate_up_proj"] = torch.cat([*up[:, :half], *up[:, half:]])[None]
            layer["mlp.experts.down_proj"] = torch.cat(list(down), dim=1)[None]
            layer["mlp.gate.weight"] = layer["mlp.gate.weight"][:1]
            widths.append(k * half)
            n, k = 1, 1
        counts.append(n)
        active.append(k)
        for key, v in layer.items():
            state[fam.layer_key(i, key)] = v
    windows = [None] * len(keep)
    model = student_model(
        teacher.config.to_dict(), state, widths, windows, None, experts=counts, top_k=active, dtype=torch.float32
    )
    summary = {
        "family": name,
        "intermediate_sizes": widths,
        "layer_windows": windows,
        "layer_experts": counts,
        "layer_top_k": active,
        "remote_code": needs_modeling_code(widths, windows, experts=counts, top_k=active),
        "layers": len(keep),
    }
    write_student_files(folder, model, summary, tok, teacher_sha256="0" * 64)
    record_checksums(folder)
    return folder


def student_logits(folder: Path, ids: list[int]):
    """(len(ids), vocab) float64 logits of a student folder in transformers at f32 (``load_student``)."""
    import torch

    from zgtrain.student.load import load_student

    with torch.no_grad():
        return load_student(folder)(torch.tensor([ids])).logits[0].double().numpy()
