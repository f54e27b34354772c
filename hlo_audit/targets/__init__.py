"""Targets turn a matrix cell into HLO text. See base.py for the interface."""
