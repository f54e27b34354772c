"""The commands' own steps beyond the gate, each over a judged ``Outcome`` or the cells' results: ``golden update``
(``golden_update``: what it writes, staged and swapped in), ``measure`` (a step's real run timed, and its host
figure), ``explain`` (the tree of where a cell's entry parameters come from) and what ``explain``, ``rng``, ``lower``
and ``diff`` read (``inputs``). Above judging, below the formats (``hlo_audit.layers``): a format prints what these
return, the command (``hlo_audit.audit``) runs them."""
