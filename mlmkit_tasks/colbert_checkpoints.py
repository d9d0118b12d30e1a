"""What a late-interaction checkpoint declares, as the colbert task's options: a sentence-transformers
MultiVectorEncoder (or PyLate) directory, or a Stanford ColBERT checkpoint."""

from __future__ import annotations

import string
from pathlib import Path

from mlmkit.taskkit import CheckpointInfo, Options
from mlmkit_tasks.embedding_st import ST_PROMPTS, st_json

PUNCTUATION = " ".join(string.punctuation)
"""The default skiplist, as ColBERT, PyLate and sentence-transformers' legacy loaders have it."""


def multi_vector_options(d: Path, positions: int) -> CheckpointInfo:
    """What a sentence-transformers MultiVectorEncoder (or PyLate) directory declares: the projection's
    size, the lengths, the query expansion, the skiplist, the normalisation and the markers."""
    modules = st_json(d / "modules.json", optional=True)
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    st = st_json(d / "sentence_bert_config.json", optional=True)
    top = st_json(d / "config_sentence_transformers.json", optional=True)
    options: Options = {"normalize": "Normalize" in kinds or any(str(m.get("type", "")).startswith("pylate.")
                                                                  for m in kinds.values())}
    if "Dense" in kinds:
        dense = st_json(d / str(kinds["Dense"].get("path", "1_Dense")) / "config.json", optional=True)
        if isinstance(dense.get("out_features"), int):
            options["dim"] = dense["out_features"]
    if "MultiVectorMask" in kinds:
        mask = st_json(d / str(kinds["MultiVectorMask"].get("path", "")) / "config.json", optional=True)
        options["skiplist"] = " ".join(mask.get("skiplist_words") or [])
    elif "query_prefix" in top:  # PyLate's own keys; its default skiplist is punctuation
        words = top.get("skiplist_words")
        options["skiplist"] = " ".join(words) if isinstance(words, list) else PUNCTUATION
    expansion = st.get("query_expansion")
    options["query_expansion"] = isinstance(expansion, dict)
    if isinstance(expansion, dict):
        options["attend_expansion"] = bool(expansion.get("attend", False))
        if isinstance(expansion.get("length"), int):
            options["query_length"] = expansion["length"]
    elif "query_prefix" in top:  # PyLate's own keys
        options["query_expansion"] = top.get("do_query_expansion", True) is not False
        options["attend_expansion"] = bool(top.get("attend_to_expansion_tokens", False))
        if isinstance(top.get("query_length"), int):
            options["query_length"] = top["query_length"]
    if "query_length" not in options:  # no expansion: queries are cut where documents are
        length = st.get("query_length") or st.get("max_seq_length")
        options["query_length"] = length if isinstance(length, int) and length > 0 else positions
    prompts = top.get("prompts") or {}
    for option, names in ST_PROMPTS.items():
        prefix = top.get("query_prefix" if option == "query_prompt" else "document_prefix") or ""
        found = [prompts[n] for n in names if isinstance(prompts.get(n), str)]
        options[option] = prefix + (found[0].removeprefix(prefix) if found else "")
    info: CheckpointInfo = {"options": options}
    length = st.get("document_length") or top.get("document_length") or st.get("max_seq_length")
    if isinstance(length, int) and length > 0:
        info["max_length"] = length
    return info


def stanford_options(d: Path) -> CheckpointInfo:
    """A Stanford ColBERT checkpoint's artifact.metadata: its markers, lengths, dimension, expansion."""
    meta = st_json(d / "artifact.metadata", optional=True)
    options: Options = {"normalize": True, "query_expansion": True,
                        "query_prompt": str(meta.get("query_token_id", "[unused0]")) + " ",
                        "document_prompt": str(meta.get("doc_token_id", "[unused1]")) + " ",
                        "attend_expansion": bool(meta.get("attend_to_mask_tokens", False)),
                        "skiplist": PUNCTUATION if meta.get("mask_punctuation", True) else ""}
    for key, option in (("dim", "dim"), ("query_maxlen", "query_length")):
        if isinstance(meta.get(key), int):
            options[option] = meta[key]
    info: CheckpointInfo = {"options": options}
    if isinstance(meta.get("doc_maxlen"), int):
        info["max_length"] = meta["doc_maxlen"]
    return info
