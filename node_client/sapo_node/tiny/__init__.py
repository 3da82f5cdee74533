"""The built-in tiny policies: a Qwen2-architecture model built from a config, its own byte-level
BPE tokenizer trained on reasoning-gym text, and a short supervised warm start on the easy
catalogue so it starts with partial accuracy (GRPO learns nothing from groups that all fail or
all succeed).

This package downloads nothing. The first `cache.load_tiny` builds the model (about a minute on 2 idle
CPU cores for "tiny") and saves it under <cache_dir>/<variant>-<recipe hash>/; later loads read it back.
A node first asks its site for the same model prebuilt (sapo_node.prebuilt, passed in as `fetch`) and
builds only without one.

One module per step, lowest first:
  variants     the recipes by name (TinyVariant, VARIANTS)
  tokenizer    the byte-level BPE tokenizer a recipe trains
  model        the network a recipe builds
  batches      the warm start's draws and padded batches, built here or in worker processes
  warm_start   the supervised phases (TRAIN_SEED)
  recipe       what a build depends on, and its digest
  build        tokenizer, network and warm start in one call, with what it measured
  cache        the folder per recipe, its lock, prebuilt or built, and `load_tiny`
  generation   completion texts with the node's sampler
  evaluation   answers and scores on held-out questions (EVAL_SEED)
  cli          `python -m sapo_node.tiny --variant tiny --eval`
"""
