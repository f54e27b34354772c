"""The gate's rules, one spec each (``spec.RuleSpec``), listed once in ``registry.SPECS``.

A rule is one module here: its spec (name, default action, tolerance, the kinds of change it reads, its judge, the
typed facts its findings carry) beside the judge it names. Everything that lists rules derives from the registry:
the ``Rule`` names, the default policy, the table the gate applies, the ``[policy]`` keys a config accepts (actions and
tolerances) and the tolerances a policy's fingerprint reads. docs/development.md ("Adding a rule") says how to add
one.
"""
