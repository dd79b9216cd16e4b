"""Research evaluation: ``ditto eval`` (perplexity, KL divergence, HumanEval), ``ditto bench``
and ``ditto compare`` (docs/RESULTS.md)."""
