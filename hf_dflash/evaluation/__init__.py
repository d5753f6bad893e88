# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Measuring drafters: evaluation prompts from PyPI wheels, acceptance (tau), the benchmark, its report, the demo.

- :mod:`hf_dflash.evaluation.prompts`: HumanEval, GSM8K, AIME 2025, MT-Bench and the workloads (code edits,
  documents, multi-turn, the context sweep) read straight from wheels;
- :mod:`hf_dflash.evaluation.acceptance`: tau and acceptance by block position from real ``generate`` calls;
- :mod:`hf_dflash.evaluation.bench`: ``hf-dflash bench`` (methods side by side, resumable);
- :mod:`hf_dflash.evaluation.methods`: the bench's methods and one timed ``generate`` call;
- :mod:`hf_dflash.evaluation.progress`: a bench run's progress file (a killed run resumes);
- :mod:`hf_dflash.evaluation.summaries`: the bench's per-method figures, its check and its JSON report;
- :mod:`hf_dflash.evaluation.batch`: ``hf-dflash bench --batch-sizes`` (batched throughput);
- :mod:`hf_dflash.evaluation.machine`: the stamp of a measurement (date, commit, versions, CPU, threads, load);
- :mod:`hf_dflash.evaluation.report`: Markdown tables and the plot;
- :mod:`hf_dflash.evaluation.demo`: ``hf-dflash demo``.
"""
