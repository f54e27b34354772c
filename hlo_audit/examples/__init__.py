"""Example targets, small enough to read in one sitting; see README "Any JAX function"."""
