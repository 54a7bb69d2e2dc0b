"""flashscale.data: text -> tokens -> training batches.

    corpus.py     the bundled corpus and user files (.txt/.jsonl, optionally .xz, folders) -> documents
    tokenizer.py  byte-level BPE training (cached) and loading (tokenizer.json, model folder, GGUF)
    tokens.py     documents -> a cached, memory-mapped token file with an EOS after each document;
                  train/validation split on a document boundary
    sampler.py    deterministic, rank-sharded, resumable windows of seq_len + 1 tokens
    cache.py      the cache folder ($FLASHSCALE_CACHE or ~/.cache/flashscale) and atomic writes
"""
