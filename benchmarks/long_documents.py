"""Long documents: an index of chunks (`--chunk-tokens`) against one vector a document, truncated at the
model's length.

    python benchmarks/long_documents.py [--group 10] [--chunk-tokens 120] [--chunk-overlap 16]

The long-document set is made from the built-in retrieval set (1,000 docstrings, 200 test queries):
its documents shuffled (seed 0) and joined ``--group`` at a time, in that order, into one document of
the new set (ids L0, L1, ...; "title text" of each, joined by a blank line); a query's relevant
document is the long one holding its relevant docstring, which sits anywhere in it (a tenth of them
first, where truncation sees it). Each bundle of benchmarks/hybrid.py (all-MiniLM-L6-v2 zero-shot,
max length 256; and fine-tuned on the built-in set, max length 128) indexes the set twice: one vector a
document (truncated), and chunked; `mlmkit evaluate INDEX` gives nDCG@10 and recall@100 of each, on the
same queries. Quality is deterministic: no timing.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from common import (
    log,
    print_machine,
)
from harness import parser
from hybrid import bundles, mlmkit

THREADS = 2


def long_set(short: Path, out: Path, group: int) -> dict[str, int]:
    """The built-in set's documents joined ``group`` at a time into long ones, its qrels moved to them."""
    docs = [json.loads(line) for line in open(short / "corpus.jsonl")]
    random.Random(0).shuffle(docs)
    out.mkdir(parents=True, exist_ok=True)
    where: dict[str, str] = {}
    with open(out / "corpus.jsonl", "w") as f:
        for g in range(0, len(docs), group):
            part = docs[g:g + group]
            for d in part:
                where[d["_id"]] = f"L{g // group}"
            text = "\n\n".join(f"{d.get('title', '')} {d['text']}".strip() for d in part)
            f.write(json.dumps({"_id": f"L{g // group}", "title": "", "text": text}) + "\n")
    shutil.copy(short / "queries.jsonl", out / "queries.jsonl")
    (out / "qrels").mkdir(exist_ok=True)
    for split in (short / "qrels").glob("*.tsv"):
        lines = split.read_text().splitlines()
        rows = {(q, where[d]) for q, d, *_ in (line.split("\t") for line in lines[1:]) if d in where}
        (out / "qrels" / split.name).write_text("query-id\tcorpus-id\tscore\n"
                                                + "".join(f"{q}\t{d}\t1\n" for q, d in sorted(rows)))
    return {"documents": -(-len(docs) // group), "docstrings_each": group}


def main() -> None:
    ap = parser(__doc__, work="/tmp/mlmkit-bench-hybrid",
                work_help="shared with hybrid.py's bundles (made when missing)",
                patience=600.0, before="each bundle's training")
    ap.add_argument("--group", type=int, default=10, help="docstrings joined into one long document")
    ap.add_argument("--chunk-tokens", type=int, default=120, help="chunk length in tokens (default 120)")
    ap.add_argument("--chunk-overlap", type=int, default=16,
                    help="tokens shared by neighbouring chunks (default 16)")
    args = ap.parse_args()
    print_machine(THREADS)
    from mlmkit.quickstart.retrieval_set import write_retrieval_set

    work = args.work
    if not (work / "set" / "corpus.jsonl").is_file():
        write_retrieval_set(work / "set", max_documents=1000)
    data = work / f"long-set-{args.group}"
    log(f"long-document set: {long_set(work / 'set', data, args.group)}")
    lines = []
    for name, bundle in bundles(work, args.patience).items():
        got = {}
        for how, flags in (("truncated", []),
                           ("chunked", ["--chunk-tokens", str(args.chunk_tokens), "--chunk-overlap",
                                                           str(args.chunk_overlap)])):
            ix = work / f"long-{how}-{bundle.name}-{args.group}"
            shutil.rmtree(ix, ignore_errors=True)
            built = json.loads(mlmkit("index", str(bundle), "--corpus", str(data / "corpus.jsonl"), "--out",
                                      str(ix), *flags, "--json"))
            got[how] = {**json.loads(mlmkit("evaluate", str(ix), "--data", str(data), "--json")),
                        "rows": built["count"]}
        t, c = got["truncated"], got["chunked"]
        lines.append(f"{name}: truncated ({t['rows']} rows) nDCG@10 {t['ndcg@10']:.4f} recall@100 "
                     f"{t['recall@100']:.4f}; "
                     f"chunked at {args.chunk_tokens} tokens ({c['rows']} rows) nDCG@10 {c['ndcg@10']:.4f} "
                     "recall@100 "
                     f"{c['recall@100']:.4f} (chunked-gain-ndcg10={c['ndcg@10'] - t['ndcg@10']:+.4f})")
        log(lines[-1])
    print(f"long documents: {args.group} docstrings each; the built-in set's 200 test queries")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
