"""filters.py: a filter returns the true top k of the documents it keeps, in every kind of search."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from index_helpers import (
    brute,
    one_red_line,
    runner,
)

from mlmkit.cli import app
from mlmkit.retrieval.index import BuildArgs, Index, build, search_vectors

pytest_plugins = ["index_fixtures"]


def test_a_filter_returns_the_true_top_k_of_the_documents_it_keeps_in_every_kind_of_search(
    setup, tagged, tmp_path, monkeypatch):
    from mlmkit.retrieval.index import filters
    from mlmkit.retrieval.index import search as search_module

    docs, defaults = tagged["docs"], (search_module.SUBSET, search_module.SUBSET_SHARE)
    year = np.asarray([d["year"] for d in docs])
    cases = {"year=2042": year == 2042, "year>=2090": year >= 2090,
             "lang=en": np.asarray([d["lang"] == "en" for d in docs]),
             "lang in de,fr": np.asarray([d["lang"] == "de" for d in docs]),
             "ok=true": np.asarray([d["ok"] for d in docs]),
             "extra!=x": np.arange(len(docs)) >= 100,
             "id in d5,d7,d1100": np.isin(np.arange(len(docs)), [5, 7, 1100])}
    for name, kw in (("flat", {}), ("hnsw", {"ann": "hnsw"}), ("ivf", {"ann": "ivf", "ivf_lists": 8}),
                     ("binary", {"quantization": "binary", "rescore_copy": "float16"})):
        ix = tmp_path / name
        build(BuildArgs(setup["bundle"], tagged["corpus"], ix, window=256, **kw))
        index = Index.open(ix)
        for subset in (True, False):  # few rows: scored alone, exactly; else inside each stage (forced here)
            monkeypatch.setattr(search_module, "SUBSET", 65536 if subset else 0)
            monkeypatch.setattr(search_module, "SUBSET_SHARE", 1.0 if subset else 0.0)
            for where, keep in cases.items():
                rows, _ = search_vectors(index, setup["q"], 10,
                                         where=filters.rows(index, filters.parse([where])),
                                         # binary: its own recall aside
                                         rescore=index.count if name == "binary" else None)
                want = brute(setup, keep)
                got = [[int(r) for r in row if r >= 0] for row in rows]
                if name == "flat":
                    assert got == want, (name, where)
                # approximate (float16 rescoring, ANN): the filter holds, and the top 10 is mostly found
                else:
                    assert all(keep[r] for row in got for r in row), (name, where)
                    assert np.mean([len(set(g) & set(w)) / len(w)
                                    for g, w in zip(got, want)]) > (0.95 if subset else 0.8), (name, where)
    # the defaults: a filter keeping a few rows is searched
    monkeypatch.setattr(search_module, "SUBSET", defaults[0])
    # over them alone, one keeping half is not
    monkeypatch.setattr(search_module, "SUBSET_SHARE", defaults[1])
    subsets = []
    real = search_module._search_subset
    monkeypatch.setattr(search_module, "_search_subset", lambda *a: subsets.append(len(a[3])) or real(*a))
    flat = Index.open(tmp_path / "flat")
    for where in ("id in d5,d7,d1100", "ok=true"):
        search_vectors(flat, setup["q"], 10, where=filters.rows(flat, filters.parse([where])))
    assert subsets == [3], subsets
    r = runner.invoke(app, ["search", str(tmp_path / "flat"), setup["queries"][0], "--where", "lang=en",
                            "--where", "year<2010",
                            "--top-k", "3", "--json"])
    assert r.exit_code == 0, r.output
    both = np.asarray([d["lang"] == "en" and d["year"] < 2010 for d in docs])
    assert [h["id"] for h in json.loads(r.stdout)["hits"]] == [f"d{j}" for j in brute(setup, both, 3)[0]]
    (tmp_path / "ids.txt").write_text("d3\nd9\n")
    r = runner.invoke(app, ["search", str(tmp_path / "flat"), "a dog", "--where",
                            f"id in @{tmp_path / 'ids.txt'}", "--json"])
    assert r.exit_code == 0 and {h["id"] for h in json.loads(r.stdout)["hits"]} == {"d3", "d9"}, r.output
    for where, said in (("colour=red", "the index has no field 'colour'"),
                        ("lang>=en", "lang holds string values; >= compares"),
                        ("year=soon", "year holds numbers; 'soon' is not one"),
                        ("ok=maybe", "give true or false"),
                        ("lang", "not FIELD=VALUE"), ("tags=a", "tags holds lists or objects")):
        assert said in one_red_line(runner.invoke(app, ["search", str(tmp_path / "flat"), "a dog", "--where",
                                                        where])), where


def test_a_field_of_another_kind_names_its_line_and_filters_survive_an_upsert_and_a_compaction(
        setup, tagged, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"_id": "a", "text": "one", "year": 2020}) + "\n"
                   + json.dumps({"_id": "b", "text": "two", "year": "soon"}) + "\n")
    r = runner.invoke(app,
                      ["index", str(setup["bundle"]), "--corpus", str(bad), "--out", str(tmp_path / "bad")])
    assert ("bad.jsonl, line 2" in one_red_line(r)
            and "field 'year' is a string here and a number before" in r.stderr)
    huge = tmp_path / "huge.jsonl"  # an integer no float holds: one line, not an OverflowError
    huge.write_text(json.dumps({"_id": "a", "text": "one"}) + "\n" + '{"_id": "b", "text": "two", "n": 1'
                    + "0" * 400 + "}\n")
    r = runner.invoke(app, ["index", str(setup["bundle"]), "--corpus", str(huge), "--out",
                            str(tmp_path / "h")])
    assert "huge.jsonl, line 2" in one_red_line(r) and "field 'n' is a number no float holds" in r.stderr
    ix = tmp_path / "ix"
    build(BuildArgs(setup["bundle"], tagged["corpus"], ix))
    before = sorted(p.name for p in ix.iterdir())  # an upsert that changes a field's kind changes nothing
    (tmp_path / "kind.jsonl").write_text(json.dumps({**tagged["docs"][0], "year": "twenty"}) + "\n")
    r = runner.invoke(app, ["index", str(ix), "--upsert", str(tmp_path / "kind.jsonl")])
    assert "field 'year' is a string here and a number in the index's other documents" in one_red_line(r)
    assert sorted(p.name for p in ix.iterdir()) == before
    (tmp_path / "up.jsonl").write_text("".join(json.dumps({**d, "lang": "fr"}) + "\n"
                                               for d in tagged["docs"][:50]))
    assert runner.invoke(app, ["index", str(ix), "--upsert", str(tmp_path / "up.jsonl")]).exit_code == 0
    (tmp_path / "gone.txt").write_text("d60\nd61\n")
    assert runner.invoke(app, ["index", str(ix), "--delete", str(tmp_path / "gone.txt")]).exit_code == 0
    from mlmkit.retrieval.index import filters

    for step in ("deleted", "compacted"):
        index = Index.open(ix)
        fr = filters.rows(index, filters.parse(["lang=fr"]))
        assert sorted(index.ids(np.flatnonzero(fr & ~(index.deleted if index.deleted is not None
                                                      else False)))) == \
            sorted(f"d{i}" for i in range(50))
        rows, _ = search_vectors(index, setup["q"], 100,
                                 where=filters.rows(index, filters.parse(["lang=de"])))
        got = {i for row in rows for i in index.ids(row[row >= 0])}
        assert got and not got & ({f"d{i}" for i in range(50)} | {"d60"}), step
        assert runner.invoke(app, ["index", str(ix), "--compact"]).exit_code == 0


def test_a_where_file_is_a_bounded_regular_utf8_file_or_one_line(tmp_path):
    """--where "id in @FILE" reads a regular file of UTF-8 text, bounded; a binary file, a device or
    a directory is one line naming it, never a traceback or a read without end; a request to the
    server never names a file, however the condition is spaced."""
    from mlmkit.errors import ConfigError
    from mlmkit.retrieval.index.filters import parse

    ok = tmp_path / "ids.txt"
    ok.write_text("d1\n\nd2 \n")
    assert parse([f"id in @{ok}"])[0].values == ("d1", "d2")
    binary = tmp_path / "ids.bin"
    binary.write_bytes(b"d1\n\xff\xfe\x00")
    for value, said in ((binary, "is not UTF-8 text"), (Path("/dev/zero"), "is not a regular file"),
                        (tmp_path, "is not a regular file"), (tmp_path / "nope", "does not exist")):
        with pytest.raises(ConfigError, match=said) as e:
            parse([f"id in @{value}"])
        assert "\n" not in str(e.value)
    for spaced in (f"id in @{ok}", f"id\tin\t@{ok}", f"id  in\n@{ok}"):
        with pytest.raises(ConfigError, match="given inline here"):
            parse([spaced], files=False)
