"""live.py: deletes, upserts and a compaction equal a build of the final corpus; a kill leaves the index
before or after; bad input changes nothing."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from index_helpers import (
    DOCS,
    as_queries_of,
    built,
    hits_of,
    killed_after,
    live_documents,
    one_red_line,
    runner,
)
from task_runs import sentence

from mlmkit.cli import app
from mlmkit.retrieval.index import BuildArgs, Index, build, search_vectors

pytest_plugins = ["index_fixtures"]


def test_deletes_upserts_and_compaction_equal_a_build_of_the_final_corpus_and_a_kill_leaves_before_or_after(
        setup, tmp_path, monkeypatch):
    from mlmkit.retrieval.index import live

    ix = tmp_path / "live"
    shutil.copytree(built(setup, "f32").path, ix)
    (tmp_path / "gone.txt").write_text("".join(f"d{i}\n" for i in range(100)))
    changed = [{"_id": f"d{i}", "title": "changed", "text": sentence(random.Random(i), 6)}
               for i in range(100, 150)]
    added = [{"_id": f"n{i}", "title": "", "text": sentence(random.Random(1000 + i), 8)} for i in range(50)]
    (tmp_path / "up.jsonl").write_text("".join(json.dumps(d) + "\n" for d in changed + added))
    final = setup["docs"][150:] + changed + added
    (tmp_path / "final.jsonl").write_text("".join(json.dumps(d) + "\n" for d in final))
    build(BuildArgs(setup["bundle"], tmp_path / "final.jsonl", tmp_path / "scratch"))
    want = hits_of(tmp_path / "scratch", setup["q"])

    # the operation stopped as a kill would: just before its manifest is written, or just after
    def killed(step, after):
        real = live.write_json

        def stop(*a, **kw):
            if after:
                real(*a, **kw)
            raise KeyboardInterrupt
        monkeypatch.setattr(live, "write_json", stop)
        with pytest.raises(KeyboardInterrupt):
            step()
        monkeypatch.setattr(live, "write_json", real)

    before = hits_of(ix, setup["q"])
    r = runner.invoke(app, ["index", str(ix), "--delete", str(tmp_path / "gone.txt"), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["deleted"] == 100, r.output
    deleted = hits_of(ix, setup["q"])
    assert not {f"d{j}" for j in range(100)} & {i for hits in deleted for i in hits}
    # never fewer: the deleted rows never take a place
    assert deleted != before and all(len(h) == 10 for h in deleted)
    r = runner.invoke(app, ["index", str(ix), "--upsert", str(tmp_path / "up.jsonl"), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["deleted"] == 150, r.output
    assert hits_of(ix, setup["q"]) == want
    snapshot = tmp_path / "snapshot"
    shutil.copytree(ix, snapshot)
    killed(lambda: live.compact(ix), after=False)  # new shards written, no manifest: the index as it was
    assert hits_of(ix, setup["q"]) == want and Index.open(ix).count == DOCS + 100
    # the manifest written, the old shard not yet removed: compacted
    killed(lambda: live.compact(ix), after=True)
    assert (hits_of(ix, setup["q"]) == want and Index.open(ix).count == len(final)
            and Index.open(ix).deleted is None)
    r = runner.invoke(app, ["index", str(ix), "--compact", "--json"])  # nothing left to do but the sweep
    assert r.exit_code == 0 and json.loads(r.stdout)["count"] == len(final), r.output
    assert sorted(p.name for p in ix.iterdir() if p.name.startswith(("shard-", "deleted-"))) == \
        sorted(s.name for s in Index.open(ix).manifest.shards)
    # the snapshot (deletes and an upsert, not compacted) compacts by the command to the same
    r = runner.invoke(app, ["index", str(snapshot), "--compact", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["freed_bytes"] > 0, r.output
    assert hits_of(snapshot, setup["q"]) == want
    # a delete killed before its manifest: as before; an upsert killed mid-embedding: as before, --resume
    # finishes it
    (tmp_path / "gone2.txt").write_text("d150\n")
    killed(lambda: Index.open(snapshot).delete(tmp_path / "gone2.txt"), after=False)
    assert hits_of(snapshot, setup["q"]) == want
    (tmp_path / "up2.jsonl").write_text("".join(json.dumps({**d, "title": "again"}) + "\n"
                                                for d in setup["docs"][150:700]))
    with pytest.raises(KeyboardInterrupt):
        build(BuildArgs(snapshot, upsert=tmp_path / "up2.jsonl", window=128), killed_after(256))
    assert hits_of(snapshot, setup["q"]) == want
    build(BuildArgs(snapshot, upsert=tmp_path / "up2.jsonl", window=128, resume=True))
    assert Index.open(snapshot).live == len(final)


def test_a_sigkill_at_any_file_operation_of_a_change_leaves_the_index_before_or_after(
        setup, tmp_path):
    """A process SIGKILLed (no cleanup runs) just before each of its renames and removals
    (tests/retrieval/kill_points.py): every copy it leaves holds the documents of before or of after, exactly,
    is searchable, and the next operation goes on from it (an upsert --resume ends at after; a
    compaction removes what the kill left and keeps the documents)."""
    import subprocess
    import sys

    from mlmkit.retrieval.index import live

    ix = tmp_path / "ix"
    shutil.copytree(built(setup, "f32").path, ix)
    (tmp_path / "first.txt").write_text("d0\nd1\n")
    # a bitmap already: the delete below replaces it, compaction has work
    Index.open(ix).delete(tmp_path / "first.txt")
    (tmp_path / "gone.txt").write_text("d2\nd3\n")
    up = tmp_path / "up.jsonl"
    up.write_text("".join(json.dumps({"_id": i, "title": "", "text": sentence(random.Random(n), 6)}) + "\n"
                          for n, i in enumerate(["d4", "d5", "n0", "n1", "n2"])))
    def state(path):  # the documents, and the files the manifest names for them
        m = Index.open(path).manifest
        return live_documents(path), [s.name for s in m.shards], m.deleted.file if m.deleted else None

    before = state(ix)
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("kill_points.py")), str(ix),
                        str(tmp_path / "kills"),
                        f"delete={tmp_path / 'gone.txt'}", f"upsert={up}", "compact="], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for line in r.stdout.splitlines():
        op, points = json.loads(line)["op"], json.loads(line)["points"]
        work = tmp_path / "kills" / op
        after = state(work / str(points + 1))
        assert points >= 3 and after != before, (op, points)
        seen = set()
        for k in range(1, points + 1):
            copy = work / str(k)
            now = state(copy)
            assert now in (before, after), (op, k)
            seen.add(now == after)
            rows, _ = search_vectors(Index.open(copy), setup["q"][:2], 5)
            assert (rows >= 0).all()
            if (copy / ".pending").exists():  # an upsert killed before its manifest: --resume finishes it
                build(BuildArgs(copy, upsert=up, window=8, resume=True))
                assert live_documents(copy) == after[0], (op, k)
            else:
                Index.open(copy).compact()
                assert live_documents(copy) == now[0], (op, k)
            m = Index.open(copy).manifest
            named = {s.name for s in m.shards} | {m.deleted.file if m.deleted else None}
            assert not [p.name for p in copy.iterdir() if live.OURS.fullmatch(p.name)
                        and p.name not in named], (op, k)
        assert seen == {False, True}, (op, seen)  # kills before the switch and after it
    assert len(r.stdout.splitlines()) == 3


def test_a_live_change_refuses_bad_input_in_one_line_and_changes_nothing(setup, tmp_path):
    ix = tmp_path / "live"
    shutil.copytree(built(setup, "f32").path, ix)
    manifest = (ix / "manifest.json").read_text()
    (tmp_path / "ids.txt").write_text("d1\nnope\nd2\n")
    (tmp_path / "empty.txt").write_text("")
    cases = [
        (["index", str(ix), "--delete", str(tmp_path / "ids.txt")],
         "ids.txt, line 2: the id 'nope' is not in"),
        (["index", str(ix), "--delete", str(tmp_path / "empty.txt")], "no ids"),
        (["index", str(ix), "--delete", str(tmp_path / "ids.txt"), "--compact"],
         "one change of an index at a time"),
        (["index", str(ix), "--compact", "--out", str(tmp_path / "x")],
         "it takes no --corpus, --out or --append"),
        (["index", str(ix), "--compact", "--resume"], "takes no --resume"),
        (["index", str(ix), "--upsert", str(setup["corpus"]), "--quantization", "int8"],
         "the index's own settings"),
        (["index", str(setup["bundle"])], "needs --corpus DOCS and --out INDEX"),
        (["index", str(tmp_path / "nowhere"), "--compact"], "is not an index"),
    ]
    for argv, said in cases:
        assert said in one_red_line(runner.invoke(app, argv)), argv
        assert (ix / "manifest.json").read_text() == manifest and not list(ix.glob("deleted-*"))
    # a deleted id is not there to delete again; an id deleted can be added again
    (tmp_path / "one.txt").write_text("d1\n")
    assert runner.invoke(app, ["index", str(ix), "--delete", str(tmp_path / "one.txt")]).exit_code == 0
    assert "(or was deleted)" in one_red_line(runner.invoke(app, ["index", str(ix), "--delete",
                                                                  str(tmp_path / "one.txt")]))
    (tmp_path / "back.jsonl").write_text(json.dumps(setup["docs"][1]) + "\n")
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "back.jsonl"), "--out",
                            str(ix), "--append", "--json"])
    assert r.exit_code == 0 and Index.open(ix).live == DOCS, r.output
    dup = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(tmp_path / "back.jsonl"),
                              "--out", str(ix), "--append"])
    assert "comes twice" in one_red_line(dup)


def test_sparse_and_ann_indexes_compact_to_an_index_of_the_documents_left(setup, sparse, tmp_path):
    keep = setup["docs"][300:]
    (tmp_path / "left.jsonl").write_text("".join(json.dumps(d) + "\n" for d in keep))
    (tmp_path / "gone.txt").write_text("".join(f"d{i}\n" for i in range(300)))
    for name, bundle, kw in (("sparse", sparse["bundle"], {}),
                             ("hnsw", setup["bundle"], {"ann": "hnsw", "quantization": "int8"})):
        ix, scratch = tmp_path / name, tmp_path / f"{name}-scratch"
        build(BuildArgs(bundle, setup["corpus"], ix, **kw))
        if name == "hnsw":  # the same int8 ranges as the index's: calibrated on its first documents
            build(BuildArgs(bundle, setup["corpus"], scratch, **kw))
            (tmp_path / "gone-all.txt").write_text("".join(f"d{i}\n" for i in range(300)))
        else:
            build(BuildArgs(bundle, tmp_path / "left.jsonl", scratch))
        q = as_queries_of(Index.open(ix), bundle, setup["queries"])
        assert runner.invoke(app, ["index", str(ix), "--delete", str(tmp_path / "gone.txt")]).exit_code == 0
        if name == "hnsw":
            assert runner.invoke(app, ["index", str(scratch), "--delete",
                                       str(tmp_path / "gone-all.txt")]).exit_code == 0
        deleted = hits_of(ix, q)
        assert runner.invoke(app, ["index", str(ix), "--compact"]).exit_code == 0
        compacted = Index.open(ix)
        assert compacted.count == len(keep) and compacted.deleted is None
        assert hits_of(ix, q) == deleted
        if name == "sparse":
            assert hits_of(ix, q) == hits_of(scratch, q)
        else:
            assert compacted.manifest.ann_file == "ann-000000.faiss" and not (ix / "ann.faiss").exists()



def test_a_full_disk_fails_a_compaction_in_one_line_and_leaves_the_index_as_was(setup, tmp_path, monkeypatch):
    """The disk filling as a compaction writes (a shard's files, faiss's ANN index, the manifest) is one
    line naming the index, exit 2 (ConfigError from Index.compact()): the index opens and searches as
    before, its files byte for byte as they were; faiss writing to a full device (/dev/full) raises."""
    import errno
    import hashlib

    from mlmkit.errors import ConfigError
    from mlmkit.retrieval.index import ann, live

    ix = tmp_path / "ix"
    shutil.copytree(built(setup, "full-disk-hnsw", ann="hnsw").path, ix)
    Index.open(ix).delete([f"d{i}" for i in range(100)])
    before = hits_of(ix, setup["q"])

    def files():
        return {str(p.relative_to(ix)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(ix.rglob("*")) if p.is_file()}

    def shard_then_full(*a):  # numpy's or pyarrow's write, the shard's files written in part
        real_shard(*a)
        raise OSError(errno.ENOSPC, "No space left on device")

    def faiss_full(index, where):  # faiss's own report of a short write
        raise RuntimeError("Error in void faiss::write_index(const Index*, IOWriter*, int) at index_write"
                           ".cpp:499: Error: 'ret == (size * 4)' failed: write error in x: 4051 != 3200320 "
                           "(No space left on device)")

    def manifest_full(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    def to_full_device(path, write):  # write_faiss's own file, on a device that is always full
        real_write(path, lambda tmp: write("/dev/full"))

    real_shard, real_write, was = live._write_shard, ann.atomic_write, files()
    faults = [(live, "_write_shard", shard_then_full), (ann.faiss_module(), "write_index", faiss_full),
              (live, "write_json", manifest_full)]
    faults += [(ann, "atomic_write", to_full_device)] if Path("/dev/full").exists() else []
    for where, name, fault in faults:
        with monkeypatch.context() as m:
            m.setattr(where, name, fault)
            said = one_red_line(runner.invoke(app, ["index", str(ix), "--compact"]))
            with pytest.raises(ConfigError, match="the compaction failed: the disk is full"):
                Index.open(ix).compact()
        assert f"{ix}: the compaction failed: the disk is full" in said and "index is as it was" in said, name
        assert f"mlmkit index {ix} --compact" in said and files() == was, name
        assert Index.open(ix).deleted is not None and hits_of(ix, setup["q"]) == before, name
    assert runner.invoke(app, ["index", str(ix), "--compact"]).exit_code == 0
    assert Index.open(ix).deleted is None and hits_of(ix, setup["q"]) == before
