"""Goldens: the record of what each cell looked like when a human last accepted it (``record``), the folder that
keeps them (``store``), and `golden update` (``update``). Reading a store goes through ``store.Snapshot``."""

from __future__ import annotations

from hlo_audit.golden.record import HLO_SUFFIX, SUMMARY_SUFFIX, GoldenRecord, dumps, record_problem
from hlo_audit.golden.store import (Golden, GoldenError, Snapshot, hlo_path, load, owned_files, publish, stored_ids,
                                    summary_path)

__all__ = ["HLO_SUFFIX", "SUMMARY_SUFFIX", "Golden", "GoldenError", "GoldenRecord", "Snapshot", "dumps", "hlo_path",
           "load", "owned_files", "publish", "record_problem", "stored_ids", "summary_path"]
