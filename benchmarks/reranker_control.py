"""Is a reranker's lift over BM25 relevance, or a prior over documents? Its controls.

    python benchmarks/reranker_control.py RERANKER_BUNDLE --data SET:test --rows ROWS.jsonl

docs/retrieval.md's reranker is trained on rows that `mlmkit mine` made from every standard-library
docstring with the test split's answers left out of the corpus: every training document comes ~8
times (once as a positive, ~7 as a negative), and no test answer ever does. At evaluation, "never seen
in training" then marks exactly the documents that can be relevant, so a reranker could lift BM25 by
learning a per-document prior instead of relevance. Printed, on the test split's BM25 top 20 (the
recipe's ``--rerank-top 20``), one process, 2 threads:

- nDCG@10 of BM25, of the reranker with each query's own text, and of the reranker scoring each
  query's candidates against ANOTHER test query's text (a seeded derangement: the candidates and the
  judgements stay the query's own). Relevance needs the query, a prior over documents does not: near
  a random order means the lift is relevance, near the own-query figure means a prior;
- a random order's nDCG@10 (the mean of 100 seeded shuffles), for scale;
- with the other query's text: the reranker's mean score of the candidates seen in the training rows
  and of those never seen, and the share of queries whose top candidate is an unseen one, against
  the share of unseen candidates.

ROWS is the training file (`mlmkit mine` rows: anchor, positive, negative_N); a document is "seen"
when its text is one of the rows' texts. Nothing is timed: this checks a claim, it does not race.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

from harness import parser


def main() -> None:
    ap = parser(__doc__, patience=None, threads=2)
    ap.add_argument("reranker", type=Path, help="the reranker's bundle (mlmkit export RUN)")
    ap.add_argument("--data", required=True, help="the BEIR split evaluated (DIR:test)")
    ap.add_argument("--rows", type=Path, required=True, help="the rows the reranker was trained on")
    ap.add_argument("--top", type=int, default=20, help="BM25's candidates reranked per query")
    a = ap.parse_args()

    from mlmkit.retrieval.exact import BM25, mean_metrics
    from mlmkit.retrieval.reranking import relevance
    from mlmkit.runtime.pipeline import Pipeline
    from mlmkit.text.beir import read_split

    split = read_split(a.data, training=False)
    dids = list(split.corpus)
    texts = [split.corpus[d] for d in dids]
    qids = list(split.queries)
    rows, _ = BM25(texts).search([split.queries[q] for q in qids], a.top)
    seen: set[str] = set()
    for line in a.rows.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        seen |= {v for k, v in r.items() if k != "anchor" and isinstance(v, str)}
    cands = {q: [dids[i] for i in row] for q, row in zip(qids, rows)}
    unseen = {d for q in qids for d in cands[q] if split.corpus[d] not in seen}
    rng = random.Random(0)
    other = qids[:]
    while any(x == y for x, y in zip(other, qids)):  # a derangement: no query keeps its own text
        rng.shuffle(other)
    pipe = Pipeline.load(a.reranker, threads=a.threads)

    def reranked(text_of: dict[str, str]) -> tuple[dict[str, list[str]], dict[str, list[float]]]:
        pairs = [{"text": text_of[q], "text_pair": split.corpus[d]} for q in qids for d in cands[q]]
        flat = relevance(pipe(pairs), raw=True, meta=pipe.meta)
        scores, out, at = {}, {}, 0
        for q in qids:
            s = flat[at:at + len(cands[q])]
            at += len(cands[q])
            scores[q] = s
            out[q] = [d for _, d in sorted(zip(s, cands[q]), key=lambda x: -x[0])]
        return out, scores

    own, _ = reranked(split.queries)
    swapped, swapped_scores = reranked({q: split.queries[o] for q, o in zip(qids, other)})
    shuffles = []
    for k in range(100):
        r = random.Random(k)
        shuffles.append(mean_metrics({q: r.sample(cands[q], len(cands[q])) for q in qids},
                                     split.qrels)["ndcg@10"])
    ndcg = {name: mean_metrics(run, split.qrels)["ndcg@10"]
            for name, run in (("bm25", cands), ("own", own), ("other", swapped))}
    s_seen = [s for q in qids for d, s in zip(cands[q], swapped_scores[q]) if d not in unseen]
    s_unseen = [s for q in qids for d, s in zip(cands[q], swapped_scores[q]) if d in unseen]
    top_unseen = statistics.fmean(swapped[q][0] in unseen for q in qids)
    share_unseen = len(s_unseen) / (len(s_seen) + len(s_unseen))
    print(f"{len(qids)} test queries, BM25's top {a.top} each; {share_unseen:.1%} of the candidates never "
          "seen in training")
    print(f"nDCG@10: BM25 {ndcg['bm25']:.4f}; reranked with the query's own text {ndcg['own']:.4f}; with "
          "another query's "
          f"text {ndcg['other']:.4f}; a random order {statistics.fmean(shuffles):.4f}")
    print(f"with another query's text: mean logit of seen candidates {statistics.fmean(s_seen):.3f}, of "
          "unseen "
          f"{statistics.fmean(s_unseen):.3f}; the top candidate is an unseen one for {top_unseen:.1%} of the "
          "queries "
          f"(unseen candidates: {share_unseen:.1%})")


if __name__ == "__main__":
    main()
