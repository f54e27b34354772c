"""Example targets, small enough to read in one sitting; see docs/configuration.md, "Any JAX function"."""
