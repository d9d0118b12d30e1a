"""Token shards (mlmkit/train/corpus/shards.py): the cache reused and rebuilt when damaged, memory-mapped
and equal to direct tokenization, no shard left by a failed tokenization, and a directory, a glob or
Parquet giving the corpus their files give."""

from __future__ import annotations

import json

import numpy as np
import pytest
from corpus_helpers import DOCS, in_memory, shards, tok_fixture, write_txt  # noqa: F401  (`tok`)

from mlmkit.errors import DataFormatError, MlmkitError
from mlmkit.train.corpus import shards as corpus_shards
from mlmkit.train.corpus.files import iter_documents
from mlmkit.train.corpus.shards import tokenize_corpus


def test_tokenize_corpus_reuses_its_cache(tmp_path, tok, monkeypatch):
    p = write_txt(tmp_path / "c.txt")
    cache = tmp_path / "cache"
    first = tokenize_corpus([p], tok, cache)
    assert len(shards(cache)) == 1 and not list(cache.glob(".*"))  # no temporary left behind
    assert first.num_docs == 2 and len(first.sent_offsets) == 6

    def no_reading(path, *args):
        raise AssertionError("the corpus was read again")

    monkeypatch.setattr(corpus_shards, "iter_documents", no_reading)
    second = tokenize_corpus([p], tok, cache)
    for k in ("tokens", "sent_offsets", "doc_offsets"):
        assert np.array_equal(getattr(first, k), getattr(second, k))
    # a changed file is read again
    write_txt(p, docs=DOCS + [["A third document now."]])
    with pytest.raises(AssertionError, match="read again"):
        tokenize_corpus([p], tok, cache)
    monkeypatch.undo()
    assert tokenize_corpus([p], tok, cache).num_docs == 3


def test_token_shard_is_memory_mapped_and_equals_direct_tokenization(tmp_path, tok):
    docs = [[f"w{i} w{(i * 7) % 60} w{(i * 13) % 60}." for i in range(k, k + 1 + k % 5)] for k in range(40)]
    p = write_txt(tmp_path / "c.txt", docs=docs)
    c = tokenize_corpus([p], tok, tmp_path / "cache")
    # a 200-word vocabulary fits 16 bits
    assert isinstance(c.tokens, np.memmap) and c.tokens.dtype == np.uint16
    assert isinstance(c.sent_offsets, np.memmap) and isinstance(c.doc_offsets, np.memmap)
    got = [[s.tolist() for s in c.document(d)] for d in range(c.num_docs)]
    assert got == in_memory([p], tok)
    (shard,) = shards(tmp_path / "cache")
    m = json.loads((shard / "manifest.json").read_text())
    assert (m["tokens"], m["sentences"], m["documents"]) == (len(c.tokens), len(c.sent_offsets) - 1,
                                                             c.num_docs)
    assert m["files"][0]["path"] == str(p.resolve()) and len(m["tokenizer_sha256"]) == 64


def test_many_files_and_one_big_file_give_the_same_tokens(tmp_path, tok):
    docs = [[f"w{i} w{(i * 3) % 60}.", f"w{(i * 11) % 60} w{i % 7}."] for i in range(30)]
    parts = [write_txt(tmp_path / f"part{k}.txt", docs=docs[k * 10 : (k + 1) * 10]) for k in range(3)]
    whole = write_txt(tmp_path / "whole.txt", docs=docs)
    a, b = tokenize_corpus(parts, tok, tmp_path / "cache"), tokenize_corpus([whole], tok, tmp_path / "cache")
    for k in ("tokens", "sent_offsets", "doc_offsets"):
        assert np.array_equal(getattr(a, k), getattr(b, k))
    assert len(shards(tmp_path / "cache")) == 2  # keyed by the files: each list has its own


def test_a_failed_tokenization_leaves_no_shard(tmp_path, tok):
    good = write_txt(tmp_path / "good.txt")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine."}\n{"txt": "no text field"}\n')
    with pytest.raises(DataFormatError, match="line 2"):
        tokenize_corpus([good, bad], tok, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []  # neither a shard nor its temporary directory


@pytest.mark.parametrize("damage", ["truncated tokens", "bad manifest", "old npz cache"])
def test_damaged_cache_is_rebuilt(tmp_path, tok, damage):
    p = write_txt(tmp_path / "c.txt")
    cache = tmp_path / "cache"
    first = tokenize_corpus([p], tok, cache)
    (shard,) = shards(cache)
    want = first.tokens.tolist()
    del first
    if damage == "truncated tokens":
        (shard / "tokens.bin").write_bytes((shard / "tokens.bin").read_bytes()[:-2])
    elif damage == "bad manifest":
        (shard / "manifest.json").write_text("{not json")
    else:  # a cache entry of the same name that is not a shard directory
        import shutil

        shutil.rmtree(shard)
        shard.write_bytes(b"not a zip")
    again = tokenize_corpus([p], tok, cache)
    assert again.tokens.tolist() == want and shard.is_dir()


def test_empty_and_missing_corpus(tmp_path, tok):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    with pytest.raises(MlmkitError, match="empty"):
        tokenize_corpus([empty], tok, tmp_path / "cache")
    with pytest.raises(MlmkitError, match="not found"):
        tokenize_corpus([tmp_path / "nope.txt"], tok, tmp_path / "cache")


def test_a_directory_a_glob_and_parquet_give_the_corpus_their_files_give(tmp_path, tok, monkeypatch):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    d = tmp_path / "shards"
    d.mkdir()
    write_txt(d / "a.txt", docs=DOCS[:1])
    write_txt(d / "b.txt", docs=DOCS[1:])
    (d / ".hidden.txt").write_text("never read\n")
    (d / "notes.md").write_text("not a corpus file\n")
    want = in_memory([d / "a.txt", d / "b.txt"], tok)
    for spec in ([d], [str(d / "*.txt")], [d / "a.txt", d / "b.txt"]):
        c = tokenize_corpus(spec, tok, tmp_path / "cache")
        assert [[s.tolist() for s in c.document(i)] for i in range(c.num_docs)] == want, spec
    # Parquet: a document per row from the text column (newlines split sentences; a null row is no document)
    table = pa.table({"id": [1, 2, 3], "body": ["\n".join(DOCS[0]), None, "\n".join(DOCS[1])]})
    pq.write_table(table, tmp_path / "c.parquet")
    assert list(iter_documents(tmp_path / "c.parquet", "body")) == DOCS
    c = tokenize_corpus([tmp_path / "c.parquet"], tok, tmp_path / "cache", text_column="body")
    assert [[s.tolist() for s in c.document(i)] for i in range(c.num_docs)] == want
    with pytest.raises(DataFormatError, match=r"no column 'text' \(the columns: id, body\)"):
        list(iter_documents(tmp_path / "c.parquet"))
    # the one table reader's record ceiling holds for corpora too: a row over it is named, never read whole
    with pytest.raises(DataFormatError,  # row 1 has 39 bytes, row 3 has 44
                       match=r"c\.parquet, row 3, field 'body': a value of more than 40 bytes.*several rows"):
        list(iter_documents(tmp_path / "c.parquet", "body", max_bytes=40))
    with pytest.raises(MlmkitError, match=r"nothing-\*\.txt: no file matches this pattern"):
        tokenize_corpus([str(tmp_path / "nothing-*.txt")], tok, tmp_path / "cache")


def test_a_manifest_field_of_the_wrong_type_is_one_line_naming_it(tmp_path, tok):
    """manifest.json is read through the typed reader: a field of the wrong kind names the file and the
    field; a cache entry so damaged is rebuilt."""
    from mlmkit.train.corpus.shards import read_shard

    p = write_txt(tmp_path / "c.txt")
    want = tokenize_corpus([p], tok, tmp_path / "cache").tokens.tolist()
    (shard,) = shards(tmp_path / "cache")
    m = json.loads((shard / "manifest.json").read_text())
    (shard / "manifest.json").write_text(json.dumps({**m, "tokens": "many"}))
    with pytest.raises(MlmkitError, match=r"manifest.json.*'tokens'") as e:
        read_shard(shard, repair=False)
    assert "\n" not in str(e.value) and "mlmkit tokenize" in str(e.value.hint)
    (shard / "manifest.json").write_text(json.dumps({**m, "version": 0}))
    with pytest.raises(MlmkitError, match="version 1 .found .'mlmkit-token-shard', 0.."):
        read_shard(shard, repair=False)
    assert tokenize_corpus([p], tok, tmp_path / "cache").tokens.tolist() == want
