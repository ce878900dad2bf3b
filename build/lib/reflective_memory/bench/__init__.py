"""Benchmarks and dataset readers (the library never imports this package).

- `datasets`: conversation files (our JSON schema, LongMemEval, LoCoMo/REALTALK).
- `retrieval`: evidence coverage under a word budget, latency and ingest rate.
- `feedback`: RMM reranker learning from simulated citations.
- `conditional`: conditional-memory notes (memorize rate, coverage, prompt cost).
- `latency`: RF-Mem latency at 10K-1M memories.
- `segmentation`: SeCom segmentation scores (Pk, WindowDiff, F1).
"""

__all__: list[str] = []
