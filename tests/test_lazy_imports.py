"""Commands that never need a model never pay for importing one.

`zg --help`, `zg params`, `zg pipeline`, `zg init`, `zg data inspect` and the usage errors of the training and
verify commands each run in a fresh interpreter through `zgtrain.cli.main` (what the `zg` script,
`zgtrain.cli.run`, calls); the modules loaded when the command returns are checked. torch and transformers load in
none of them; lance and pyarrow only in `zg data inspect`, which opens datasets. `zg data verify --lineage-only`
loads torch but not transformers, though it reads the teacher's family (the mixture-of-experts kernel registers
itself with transformers only when a model is built), and a `zg repro` with nothing to train on the CPU loads
neither. Loading and validating params
(ProjectConfig.load) imports none of the four either. `zg --help` imports no typer, Rich or pydantic at all
(tests/test_cli_help.py checks its page). bench/cli_latency.py measures what this buys.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers.projects import copy_project

MODELS = ("torch", "transformers")
DATASETS = ("lance", "pyarrow")
CLI = ("typer", "rich", "pydantic")  # the command tree, its formatting, typer's value coercion

# Runs `zg ARGS...` in this interpreter, then writes the imported top-level module names to OUT.
PROBE = """
import json, sys
out, args = sys.argv[1], sys.argv[2:]
code = 0
if args[:1] == ["--load-params"]:
    from zgtrain.project.config import ProjectConfig
    ProjectConfig.load(args[1])
else:
    from zgtrain.cli import main
    try:
        main(args)
    except SystemExit as e:
        code = e.code or 0
json.dump({"code": code, "modules": sorted({m.split(".")[0] for m in sys.modules})}, open(out, "w"))
"""


def _imported(args: list[str], cwd, tmp_path, *, code: int = 0) -> set[str]:
    out = tmp_path / "modules.json"
    res = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, f"zg {' '.join(map(str, args))}:\n{res.stdout}\n{res.stderr}"
    got = json.loads(out.read_text())
    assert got["code"] == code, f"zg {' '.join(map(str, args))} exited {got['code']}:\n{res.stdout}\n{res.stderr}"
    return set(got["modules"])


def _refuse(mods: set[str], heavy: tuple[str, ...], what: str) -> None:
    loaded = sorted(m for m in heavy if m in mods)
    assert not loaded, f"{what} imported {', '.join(loaded)}"


def test_help_init_pipeline_and_params_import_no_model_and_no_dataset_library(tmp_path):
    root = tmp_path / "proj"
    _refuse(_imported(["--help"], tmp_path, tmp_path), MODELS + DATASETS + CLI, "zg --help")
    _refuse(_imported(["init", root, "--profile", "tiny"], tmp_path, tmp_path), MODELS + DATASETS, "zg init")
    assert (root / "dvc.yaml").is_file() and (root / "params.yaml").is_file()
    _refuse(_imported(["params"], root, tmp_path), MODELS + DATASETS, "zg params")
    _refuse(_imported(["pipeline"], root, tmp_path), MODELS + DATASETS, "zg pipeline")
    _refuse(_imported(["--load-params", "params.yaml"], root, tmp_path), MODELS + DATASETS, "ProjectConfig.load")


def test_usage_errors_are_found_before_torch_loads(tmp_path):
    """A bad CLI option of a training or verify command is refused (exit 2) before torch or transformers load."""
    root = tmp_path / "proj"
    _imported(["init", root, "--profile", "tiny"], tmp_path, tmp_path)
    for args in (
        ["train", "block", "b00", "--stop-after", "0"],
        ["train", "block", "b00", "--targets", "somewhere"],
        ["train", "local", "--stop-after", "-1"],
        ["data", "verify", "--sample", "0"],
    ):
        _refuse(_imported(args, root, tmp_path, code=2), MODELS, f"zg {' '.join(args)}")


def test_data_inspect_opens_datasets_without_torch_or_transformers(tiny_built, tmp_path):
    mods = _imported(["data", "inspect"], tiny_built, tmp_path)  # it only reads: the session's project stays as is
    _refuse(mods, MODELS, "zg data inspect")
    assert "lance" in mods  # it did open the datasets (the check above is not vacuous)


def test_lineage_checks_and_a_repro_with_nothing_to_do_import_no_transformers(tiny_built, tmp_path):
    root = copy_project(tiny_built, tmp_path / "proj")
    mods = _imported(["data", "verify", "--lineage-only"], root, tmp_path)
    _refuse(mods, ("transformers",), "zg data verify --lineage-only")
    assert {"torch", "lance"} <= mods  # it did open the boundaries and hash the tokens
    subprocess.run(["dvc", "commit", "-f", "-q", "teacher", "tokens", "materialize"], cwd=root, check=True)
    mods = _imported(["repro", "--json", "tokens"], root, tmp_path)  # recorded, so nothing to run
    _refuse(mods, MODELS, "zg repro (nothing to train, on the CPU)")
    assert "dvc" in mods  # it did ask DVC what is stale


# A mixture-of-experts family's kernel: known to transformers by the time a model can be built with its name, and
# not before (``zgdata.families.registry`` is imported by commands that never build a model).
MOE_PROBE = """
import sys
from zgdata.families.registry import family
fam = family("mixtral")
before = "transformers.integrations.moe" in sys.modules
name = fam.load_kwargs()["experts_implementation"]
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
from zgdata.families.moe_kernel import padded_experts_forward
print(before, ALL_EXPERTS_FUNCTIONS[name] is padded_experts_forward)
"""


def test_the_moe_kernel_registers_when_a_model_is_built_not_at_import(tmp_path):
    res = subprocess.run([sys.executable, "-c", MOE_PROBE], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert res.stdout.split()[-2:] == ["False", "True"], res.stdout + res.stderr


# Runs the `zg` script's function on ARGS in this interpreter, then prints its exit code, whether the objects the
# collector tracked were moved out of its sight (gc.freeze) for the interpreter's shutdown, and the collector's
# first threshold (set before the command's imports).
SCRIPT = """
import gc, sys
from zgtrain.cli import run
sys.argv = ["zg", *sys.argv[1:]]
try:
    run()
except SystemExit as e:
    print(e.code, gc.get_freeze_count() > 0, gc.get_threshold()[0])
"""


def test_the_zg_script_keeps_mains_exit_code_and_freezes_the_heap_for_its_exit(tmp_path):
    """The installed `zg` is ``zgtrain.cli.run``: ``main``'s exit code, unchanged, the collector's first threshold
    raised for the command's imports (``GC_FIRST_THRESHOLD``), and then ``gc.freeze()`` (the shutdown's collections
    skip what is frozen: about 1 CPU-second less per process that imported transformers)."""
    from importlib.metadata import entry_points

    from zgtrain.cli import GC_FIRST_THRESHOLD

    assert entry_points(group="console_scripts")["zg"].value == "zgtrain.cli:run"
    assert GC_FIRST_THRESHOLD > 700  # Python's default, which the threshold raises
    for args, code in ((["params"], "0"), (["train", "block", "--no-such-option"], "2")):
        res = subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=tmp_path, capture_output=True, text=True)
        assert res.stdout.split()[-3:] == [code, "True", str(GC_FIRST_THRESHOLD)], (args, res.stdout, res.stderr)
