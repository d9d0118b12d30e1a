"""The API keys every request is checked against (mlmkit/serve/guard.py): a key from the environment,
as secret stores give it."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")


def test_an_api_key_from_the_environment_as_secret_stores_give_it(monkeypatch, caplog) -> None:
    from mlmkit.args import ServeArgs
    from mlmkit.errors import ConfigError
    from mlmkit.serve.app import api_keys

    args = ServeArgs(bundles=["emb=exports/emb"])
    monkeypatch.delenv("MLMKIT_API_KEY", raising=False)
    assert api_keys(args) == ()  # unset: no check
    for empty in ("", "  ", "\n", "\r\n"):  # set but empty would serve everyone without a word
        monkeypatch.setenv("MLMKIT_API_KEY", empty)
        with pytest.raises(ConfigError, match="MLMKIT_API_KEY is set but empty"):
            api_keys(args)
    # a secret file's line end would lock every client out
    for raw in ("s3cret\n", "s3cret\r", " s3cret\r\n"):
        monkeypatch.setenv("MLMKIT_API_KEY", raw)
        with caplog.at_level("WARNING", logger="mlmkit"):
            assert api_keys(args) == (b"s3cret",)
        assert "spaces or a line break around the key" in caplog.text and "s3cret" not in caplog.text
    # the flag wins
    assert api_keys(ServeArgs(bundles=["emb=exports/emb"], api_key=["flag-key"])) == (b"flag-key",)
    with pytest.raises(ConfigError, match="an --api-key is empty or has spaces around it"):
        ServeArgs(bundles=["emb=exports/emb"], api_key=["flag-key\r"])
