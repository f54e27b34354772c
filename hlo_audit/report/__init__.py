"""Formatters: they turn results into text and do nothing else."""
