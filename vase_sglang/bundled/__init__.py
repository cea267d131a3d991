"""The bundled model and its tooling, apart from the plugin itself.

* ``tasks``       -- the generated long-chain reasoning task (``tasks.chain``).
* ``model``       -- the bundled ``chain-qwen3`` model's tokenizer and config.
* ``train``       -- how ``chain-qwen3`` was trained (its held-out checks are in
  results/chain-training; the whole log is written by a rerun).
* ``tiny_model``  -- a tiny random-weight Qwen3 for exact comparisons in tests and benchmarks.
* ``demo``        -- one policy's rounds over random tensors, printed.
"""
