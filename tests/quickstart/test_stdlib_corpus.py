"""The standard library's docstrings as a corpus (mlmkit/quickstart/stdlib_corpus.py): parsed once,
cached, and parsed again when a file changes."""

from __future__ import annotations


def test_the_standard_librarys_docstrings_are_parsed_once_and_parsed_again_when_a_file_changes(tmp_path,
                                                                                               monkeypatch):
    from mlmkit.quickstart import stdlib_corpus

    lib = tmp_path / "lib"
    (lib / "json").mkdir(parents=True)
    (lib / "site-packages" / "big").mkdir(parents=True)
    (lib / "json" / "__init__.py").write_text('"""Read a JSON document. It is a text format."""\n')
    (lib / "site-packages" / "big" / "m.py").write_text('"""Not the standard library at all. It is skipped '
                                                        'here."""\n')
    (lib / "csv.py").write_text('def reader():\n    """Read the rows of a file. Each row is a list."""\n')
    monkeypatch.setattr(stdlib_corpus.sysconfig, "get_paths", lambda: {"stdlib": str(lib)})
    monkeypatch.setenv("MLMKIT_CACHE", str(tmp_path / "cache"))
    real = stdlib_corpus._parsed
    parsed = []
    monkeypatch.setattr(stdlib_corpus, "_parsed", lambda *a: parsed.append(1) or real(*a))

    def fresh():
        stdlib_corpus.definitions.cache_clear()
        return stdlib_corpus.definitions()

    want = (("csv", "reader", ("Read the rows of a file.", "Each row is a list.")),
            ("json", "", ("Read a JSON document.", "It is a text format.")))
    try:
        assert fresh() == want and len(parsed) == 1
        assert fresh() == want and len(parsed) == 1  # read from the cache
        cached = next((tmp_path / "cache" / "stdlib-docstrings").iterdir())
        cached.write_text("[1, 2")  # a damaged cache: parsed again, and written again
        assert fresh() == want and len(parsed) == 2 and fresh() == want and len(parsed) == 2
        # another Python's files
        (lib / "csv.py").write_text('def reader():\n    """Read the rows of a CSV file. Each row is a '
                                    'list."""\n')
        assert fresh()[0][2] == ("Read the rows of a CSV file.", "Each row is a list.") and len(parsed) == 3
    finally:
        stdlib_corpus.definitions.cache_clear()
