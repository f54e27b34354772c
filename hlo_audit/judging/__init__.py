"""Judging: a run's results against the goldens. The ``Outcome`` of a command, built and judged once (``outcome``:
each cell's comparison, ``hlo_audit.comparison.CellDelta``, made there), and the gate that applies the rules, the
policy and the waivers (``gate``). Above the running layer, below the commands' own steps (``hlo_audit.commands``)
and the formats (``hlo_audit.layers``); the goldens' store is ``hlo_audit.golden``."""
