"""Benchmarks of reflective-memory (beside the library: a source checkout has them, the wheel not).

Run them as `reflective-memory bench ...` from a checkout; the library never imports this
package. Conversation files are read with the library's own `reflective_memory.io`.

- `retrieval` / `systems`: evidence coverage under a word budget, what `k=5` returns, session
  recall, latency and ingest rate; `roles`: speaker names or user / assistant (`--roles`);
  `perturb`: messy histories built from the data (`--perturb`).
- `feedback` / `feedback_report`: RMM reranker learning from simulated citations.
- `conditional`: conditional-memory notes (memorize rate, coverage, prompt cost).
- `latency`: RF-Mem latency at 10K-1M memories.
- `segmentation`: SeCom segmentation scores (Pk, WindowDiff, F1).
- `ingest`: bulk and per-message ingest turns/s against bare embedding, with LlamaIndex and
  LangChain reference rows (`ingest_peers`); `add_turn`: `add_turn` latency at 10K-100K turns
  of history; `storage`: the store backends.
- `soak`: the reliability soaks (threads, processes, SIGKILL loop); `attacks`: what
  unauthenticated MCP clients (body floods, stalled bodies) and a huge gzip line cost.
- `smalltalk`: the short-turn rule's word count, fitted and left-one-conversation-out.
"""

__all__: list[str] = []
