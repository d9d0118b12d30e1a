"""Retrieval: exact and BM25 search, the IR metrics, MaxSim, reranking, hard-negative mining, and the
on-disk index (index/). No torch."""
