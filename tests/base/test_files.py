"""Atomic writes: the old file survives a writer that dies, nothing temporary is left, and files get
the mode the user's umask asks for (not mkstemp's 0600)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mlmkit.errors import ConfigError
from mlmkit.files import atomic_open, atomic_write, atomic_write_text, read_json, write_json, write_jsonl


class Killed(Exception):
    pass


def test_atomic_write_keeps_the_old_file_when_the_writer_dies(tmp_path: Path) -> None:
    p = tmp_path / "file.txt"
    atomic_write_text(p, "old")

    def dies(tmp: str) -> None:
        Path(tmp).write_text("new but only half")
        raise Killed

    with pytest.raises(Killed):
        atomic_write(p, dies)
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["file.txt"]  # no temporary left behind


def test_a_stream_replaces_the_file_only_when_complete(tmp_path: Path) -> None:
    p = tmp_path / "out.jsonl"
    write_jsonl(p, [{"a": 1}])
    with pytest.raises(Killed), atomic_open(p) as f:
        f.write('{"b": 2}\n')
        f.flush()
        raise Killed
    assert p.read_text() == '{"a": 1}\n' and len(list(tmp_path.iterdir())) == 1
    with atomic_open(p) as f:
        f.write("é\n")
    assert p.read_text(encoding="utf-8") == "é\n"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_mode_of_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        write_json(tmp_path / "a.json", {"x": 1})
        atomic_write(tmp_path / "b.bin", lambda tmp: Path(tmp).write_bytes(b"\0"))
    finally:
        os.umask(old)
    for name in ("a.json", "b.bin"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name


def test_read_json_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.json not found"):
        read_json(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(ConfigError, match=r"bad\.json: corrupted JSON"):
        read_json(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"list\.json: expected a JSON object, found list"):
        read_json(tmp_path / "list.json")
