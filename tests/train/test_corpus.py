"""Corpus reading, cached tokenization, NSP instances and --no-nsp packing (mlmkit.corpus)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from mlmkit.errors import DataFormatError, MlmkitError
from mlmkit.text.tokenizer import special_ids, train_tokenizer
from mlmkit.train.corpus import instances as corpus_instances
from mlmkit.train.corpus import shards as corpus_shards
from mlmkit.train.corpus.files import iter_documents
from mlmkit.train.corpus.instances import nsp_instances, packed_instances
from mlmkit.train.corpus.shards import TokenizedCorpus, tokenize_corpus
from mlmkit.train.data import PretrainData

FIRST_ID = 5  # ids 0-4 are the special tokens


def sentence_corpus(
    n_docs: int = 1000, seed: int = 0, sent_len: tuple[int, int] = (3, 14), sents: tuple[int, int] = (2, 12)
) -> TokenizedCorpus:
    """A corpus whose every token of sentence s (global index) has the id FIRST_ID + s, so each token
    tells which sentence, and therefore which document, it comes from."""
    rng = random.Random(seed)
    tokens, sent_lens, doc_sizes = [], [], []
    s = 0
    for _ in range(n_docs):
        n = rng.randint(*sents)
        doc_sizes.append(n)
        for _ in range(n):
            k = rng.randint(*sent_len)
            tokens += [FIRST_ID + s] * k
            sent_lens.append(k)
            s += 1
    return TokenizedCorpus(
        np.asarray(tokens, np.int32),
        np.concatenate([[0], np.cumsum(sent_lens)]).astype(np.int64),
        np.concatenate([[0], np.cumsum(doc_sizes)]).astype(np.int64),
    )


def doc_of_sentence(c: TokenizedCorpus) -> np.ndarray:
    return np.repeat(np.arange(c.num_docs), np.diff(c.doc_offsets))


# ---- NSP instances -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nsp_setup():
    c = sentence_corpus()
    return c, nsp_instances(c, 64, random.Random(0))


def test_isnext_rate_is_about_half(nsp_setup):
    c, inst = nsp_setup
    units = corpus_instances.instance_units(c, 64, nsp=True)
    assert len(inst) == len(units) - 1 > 1000  # one instance per unit and epoch
    is_next = np.mean([x.is_next == 0 for x in inst])  # label 0 = IsNext, as transformers
    assert 0.45 <= is_next <= 0.55, is_next


def test_random_b_never_comes_from_a_document_of_a(nsp_setup):
    c, inst = nsp_setup
    doc = doc_of_sentence(c)
    for x in inst:
        sa, sb = x.a - FIRST_ID, x.b - FIRST_ID
        docs_a, docs_b = set(doc[sa]), set(doc[sb])
        assert len(docs_a) == 1  # segment A is from one document
        assert len(np.unique(sa)) == sa.max() - sa.min() + 1  # consecutive sentences
        if x.is_next == 1:  # NotNext: B from another document
            assert len(docs_b) == 1 and docs_b != docs_a
        else:  # IsNext: B is what follows A in the same document
            assert docs_b == docs_a
            assert sb.min() > sa.max()


def test_isnext_b_is_the_true_continuation(nsp_setup):
    _, inst = nsp_setup
    # B starts right after A's last sentence, except where truncation dropped A's tail sentence
    follow = [int((x.b - FIRST_ID).min() == (x.a - FIRST_ID).max() + 1) for x in inst if x.is_next == 0]
    assert np.mean(follow) > 0.9


def test_lengths_within_the_maximum(nsp_setup):
    _, inst = nsp_setup
    lengths = np.array([len(x.a) + len(x.b) + 3 for x in inst])  # [CLS] A [SEP] B [SEP]
    assert lengths.max() <= 64
    assert all(len(x.a) > 0 and len(x.b) > 0 for x in inst)


def test_length_does_not_give_the_label_away(nsp_setup):
    # a random B is as long as the true continuation would be: with B filled up to the target
    # length instead, short documents let a model reach ~61% NSP accuracy from lengths alone
    _, inst = nsp_setup
    is_next = np.array([x.is_next == 0 for x in inst])
    len_b = np.array([len(x.b) for x in inst])
    total = len_b + [len(x.a) for x in inst]
    assert abs(len_b[is_next].mean() - len_b[~is_next].mean()) < 1.5
    assert abs(total[is_next].mean() - total[~is_next].mean()) < 1.5


def test_long_documents_fill_the_window_with_some_short_targets():
    c = sentence_corpus(n_docs=60, sents=(200, 300))
    inst = nsp_instances(c, 128, random.Random(0))
    lengths = np.array([len(x.a) + len(x.b) + 3 for x in inst])
    assert lengths.max() <= 128
    assert np.mean(lengths >= 110) > 0.6  # the target length is the window...
    assert 0.03 < np.mean(lengths < 64) < 0.4  # ...but shorter for 10% of the documents
    assert 0.45 <= np.mean([x.is_next == 0 for x in inst]) <= 0.55


def test_nsp_needs_two_documents():
    c = sentence_corpus(n_docs=1)
    with pytest.raises(MlmkitError, match="at least 2 documents"):
        nsp_instances(c, 64, random.Random(0))


def test_nsp_instances_are_seeded():
    c = sentence_corpus(n_docs=50)
    a = nsp_instances(c, 64, random.Random(3))
    b = nsp_instances(c, 64, random.Random(3))
    d = nsp_instances(c, 64, random.Random(4))
    key = lambda xs: [(x.a.tolist(), x.b.tolist(), x.is_next) for x in xs]  # noqa: E731
    assert key(a) == key(b) and key(a) != key(d)


# ---- --no-nsp packing --------------------------------------------------------------------------


def test_packing_respects_max_length_and_document_boundaries():
    c = sentence_corpus(n_docs=100, sent_len=(3, 70))  # some sentences longer than the window
    max_len = 48
    inst = packed_instances(c, max_len)
    doc = doc_of_sentence(c)
    by_doc: dict[int, list[int]] = {}
    for x in inst:
        assert x.b is None
        assert 0 < len(x.a) <= max_len - 2  # [CLS] A [SEP]
        docs = set(doc[x.a - FIRST_ID])
        assert len(docs) == 1, docs  # never across a document boundary
        by_doc.setdefault(docs.pop(), []).extend(x.a.tolist())
    # every token is used once, in order
    for d in range(c.num_docs):
        s0, s1 = c.doc_offsets[d], c.doc_offsets[d + 1]
        assert by_doc[d] == c.tokens[c.sent_offsets[s0] : c.sent_offsets[s1]].tolist()
    # windows are packed: a sentence that fits is not split, and windows are mostly full
    for x in inst:
        s = x.a - FIRST_ID
        first, last = s[0], s[-1]
        whole = [t for t in np.unique(s) if t not in (first, last)]
        for t in whole:
            assert (s == t).sum() == c.sent_offsets[t + 1] - c.sent_offsets[t]
    assert np.mean([len(x.a) for x in inst]) > 0.6 * (max_len - 2)


# ---- batches -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    words = [f"w{i}" for i in range(60)]
    rng = random.Random(0)
    return train_tokenizer([" ".join(rng.choices(words, k=8)) for _ in range(500)], vocab_size=200,
                           min_frequency=1)


def word_corpus(n_docs: int, seed: int = 0) -> TokenizedCorpus:
    rng = random.Random(seed)
    tokens, sent_lens, doc_sizes = [], [], []
    for _ in range(n_docs):
        n = rng.randint(2, 6)
        doc_sizes.append(n)
        for _ in range(n):
            k = rng.randint(4, 20)
            tokens += [rng.randrange(FIRST_ID, 100) for _ in range(k)]
            sent_lens.append(k)
    return TokenizedCorpus(
        np.asarray(tokens, np.int32),
        np.concatenate([[0], np.cumsum(sent_lens)]).astype(np.int64),
        np.concatenate([[0], np.cumsum(doc_sizes)]).astype(np.int64),
    )


@pytest.mark.parametrize("nsp", [True, False])
def test_batches_are_cls_a_sep_b_sep_within_max_len(tok, nsp):
    ids = special_ids(tok)
    data = PretrainData(word_corpus(80), tok, max_len=32, batch_size=16, nsp=nsp, seed=0)
    b = data.batch(0, 1, seed=7)
    assert b["input_ids"].shape[0] == 16 and b["input_ids"].shape[1] <= 32
    assert ("next_sentence_label" in b) == nsp
    labels, types, att = b["labels"], b["token_type_ids"], b["attention_mask"]
    original = torch.where(labels != -100, labels, b["input_ids"])
    for r in range(16):
        n = int(att[r].sum())
        row = original[r, :n].tolist()
        assert row[0] == ids.cls and row[-1] == ids.sep
        assert (original[r, n:] == ids.pad).all() and (types[r, n:] == 0).all()
        seps = [i for i, t in enumerate(row) if t == ids.sep]
        if nsp:
            assert len(seps) == 2
            assert (types[r, : seps[0] + 1] == 0).all() and (types[r, seps[0] + 1 : n] == 1).all()
        else:
            assert seps == [n - 1] and (types[r] == 0).all()
        assert (labels[r] != -100).any()
    # the same (epoch, index, seed) gives the same batch: resuming needs no replay
    again = data.batch(0, 1, seed=7)
    assert all(torch.equal(b[k], again[k]) for k in b)
    assert not torch.equal(data.batch(0, 2, seed=8)["input_ids"], b["input_ids"])


# ---- reading corpus files ----------------------------------------------------------------------

DOCS = [["First sentence here.", "Second one, café."], ["Another document.", "With two lines.", "And three."]]


def write_txt(path: Path, docs=DOCS, opener=open) -> Path:
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
    return path


def test_reads_txt_txt_gz_and_jsonl_alike(tmp_path):
    txt = write_txt(tmp_path / "c.txt")
    gz = write_txt(tmp_path / "c.txt.gz", opener=gzip.open)
    jl = tmp_path / "c.jsonl"
    jl.write_text("".join(json.dumps({"text": "\n".join(d), "id": i}) + "\n" for i, d in enumerate(DOCS)),
                  encoding="utf-8")
    for p in (txt, gz, jl):
        assert list(iter_documents(p)) == DOCS, p


def test_txt_tolerates_crlf_several_blank_lines_and_no_trailing_newline(tmp_path):
    p = tmp_path / "c.txt"
    p.write_bytes(b"\r\n\r\nFirst sentence here.\r\nSecond one, caf\xc3\xa9.\r\n\r\n\r\n  \r\n"
                  b"Another document.\nWith two lines.\nAnd three.")
    assert list(iter_documents(p)) == DOCS


def test_jsonl_text_without_newlines_is_split_on_sentence_ends(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"text": "One here. Two there! Three?"}) + "\n\n" + json.dumps({"text": "Alone"})
                 + "\n")
    assert list(iter_documents(p)) == [["One here.", "Two there!", "Three?"], ["Alone"]]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b'{"text": "ok"}\n{"text": broken\n', r"c\.jsonl, line 2: malformed JSON"),
        (b'{"text": "ok"}\n{"body": "no text"}\n', r"line 2, field 'text'"),
        (b'{"text": ["a list"]}\n', r"line 1, field 'text': must be a string"),
    ],
)
def test_bad_jsonl_names_line_and_field(tmp_path, content, match):
    p = tmp_path / "c.jsonl"
    p.write_bytes(content)
    with pytest.raises(DataFormatError, match=match):
        list(iter_documents(p))


def test_non_utf8_names_the_line(tmp_path):
    p = tmp_path / "c.txt"
    p.write_bytes(b"fine\nalso fine\nbad \xff\xfe byte\n")
    with pytest.raises(DataFormatError, match=r"c\.txt, line 3: .*not UTF-8") as e:
        list(iter_documents(p))
    assert e.value.line == 3 and e.value.hint


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


def shards(cache: Path) -> list[Path]:
    return [d for d in cache.iterdir() if (d / "manifest.json").is_file()]


def in_memory(paths: list[Path], tok) -> list[list[list[int]]]:
    """Every document's sentences' ids, tokenized directly: what a shard must hold."""
    return [[tok.encode(s, add_special_tokens=False).ids for s in doc] for p in paths
            for doc in iter_documents(p)]


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


def test_instance_units_are_computed_once_and_cached_beside_the_shard(tmp_path, tok, monkeypatch):
    docs = [[f"w{i} w{(i * 7) % 60} w{(i * 13) % 60} w{i % 5}." for i in range(k, k + 2 + k % 4)]
            for k in range(40)]
    p = write_txt(tmp_path / "c.txt", docs=docs)
    first = PretrainData(tokenize_corpus([p], tok, tmp_path / "cache"), tok, max_len=32, batch_size=4, seed=1)
    (shard,) = shards(tmp_path / "cache")
    assert (shard / "units-nsp-32-all.npy").is_file()

    def computed_again(*args):
        raise AssertionError("the units were computed again")

    monkeypatch.setattr(corpus_instances, "_blocks", computed_again)
    again = PretrainData(tokenize_corpus([p], tok, tmp_path / "cache"), tok, max_len=32, batch_size=4, seed=1)
    assert np.array_equal(first.units, again.units) and first.num_units > 10
    a, b = first.batch(1, 2, seed=5), again.batch(1, 2, seed=5)  # another process, the same batch
    assert all(torch.equal(a[k], b[k]) for k in a)
    # each epoch visits every unit once, in its own order
    epoch0 = first.order(0).tolist()
    assert sorted(epoch0) == list(range(first.num_units)) and epoch0 != first.order(1).tolist()


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


def test_tokenizing_in_worker_processes_gives_the_same_shard(tmp_path, tok):
    docs = [[f"w{i} w{(i * 7) % 60} w{(i * 11) % 60}.", f"w{(i * 3) % 60} w{i % 9}."] for i in range(60)]
    parts = [write_txt(tmp_path / f"part{k}.txt", docs=docs[k * 12 : (k + 1) * 12]) for k in range(5)]
    one = tmp_path / "one"
    corpus_shards.tokenize_to(parts, tok, one)
    two = tmp_path / "two"
    corpus_shards.tokenize_to(parts, tok, two, workers=2)
    for name in ("tokens.bin", "sentences.bin", "documents.bin"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    assert json.loads((one / "manifest.json").read_text()) == json.loads((two / "manifest.json").read_text())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no part left behind
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine."}\n{"txt": "no text"}\n')
    # raised in a worker, named here
    with pytest.raises(DataFormatError, match=r"bad\.jsonl, line 2, field 'text'"):
        corpus_shards.tokenize_to([*parts, bad], tok, tmp_path / "three", workers=2)
    assert not (tmp_path / "three").exists()
