"""Goldens: the record of what each cell looked like when a human last accepted it (``record``), reading the folder
that keeps them (``snapshot``: one tree, each file once), writing it all-or-nothing (``store``), and `golden
update` (``update``)."""

from __future__ import annotations

from hlo_audit.golden.record import HLO_SUFFIX, SUMMARY_SUFFIX, GoldenRecord, dumps, record_problem
from hlo_audit.golden.snapshot import (
                                       Golden,
                                       GoldenError,
                                       Snapshot,
                                       hlo_path,
                                       load,
                                       owned_files,
                                       read_snapshot,
                                       stored_ids,
                                       summary_path,
)
from hlo_audit.golden.store import publish

__all__ = ["HLO_SUFFIX", "SUMMARY_SUFFIX", "Golden", "GoldenError", "GoldenRecord", "Snapshot", "dumps", "hlo_path",
           "load", "owned_files", "publish", "read_snapshot", "record_problem", "stored_ids", "summary_path"]
