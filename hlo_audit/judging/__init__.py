"""Judging: a run's results against the goldens. The one comparison per cell (``compare.CellDelta``), the
``Outcome`` of a command built and judged once (``outcome``), the gate that applies the rules, the policy and the
waivers (``gate``), and what ``explain``, ``rng``, ``lower`` (``inputs``) and ``measure`` read. Above the running
layer, below the formats (``hlo_audit.layers``); the goldens' store is ``hlo_audit.golden``."""
