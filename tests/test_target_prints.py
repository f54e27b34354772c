"""A target that prints (at import, while lowering; from Python and from C) never reaches the command's stdout:
that is the report, a JSON document a pipeline parses (MaxText prints "[DECOUPLED NO-OP] gcs_storage: using
stubs." from an import). What it printed shows on stderr instead."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

NOISY = textwrap.dedent('''
    import ctypes
    import glob
    import os
    import time

    print("noisy: imported")
    from hlo_audit.examples import nnx_mlp


    def lower(cell):
        print("noisy: lowering", cell.id)
        if os.environ.get("NOISY_TOGETHER"):  # two cells print at the same time: each waits for the other
            open(cell.id.replace("/", "_") + ".started", "w").close()
            waited = 0
            while len(glob.glob("*.started")) < 2 and waited < 400:
                time.sleep(0.05)
                waited += 1
        for _ in range(200):
            print("noisy:", "one", "line", "in", "pieces", cell.id)
        os.write(1, b"noisy: from C, on fd 1\\n")  # what a C++ library's printf does
        return nnx_mlp.lower(cell)
''')


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_what_a_target_prints_goes_to_stderr(tmp_path, jobs):
    (tmp_path / "noisy.py").write_text(NOISY)
    (tmp_path / "hlo-audit.toml").write_text('target = "noisy:lower"\nmodels = ["mlp"]\nquant = ["none"]\n'
                                             'layers = [2, 3]\n')
    # Unbuffered, as CI runs: each piece of a print is a write of its own unless the worker keeps lines whole.
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "PYTHONUNBUFFERED": "1",
           "NOISY_TOGETHER": "1" if jobs == "2" else ""}
    proc = subprocess.run([sys.executable, "-m", "hlo_audit", "run", "--format", "json", "--jobs", jobs],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)  # nothing before or after the document
    assert [c["status"] for c in doc["cells"]] == ["ok"] * 4
    assert "noisy: imported" in proc.stderr and "noisy: lowering mlp/scan-off/none/L2" in proc.stderr
    assert "noisy: from C, on fd 1" in proc.stderr
    # Two cells printing at once never cut each other's lines.
    pieces = [line for line in proc.stderr.splitlines() if "pieces" in line or "noisy: lowering" in line]
    assert len([line for line in pieces if "pieces" in line]) == 4 * 200
    assert all(re.fullmatch(r"noisy: (one line in pieces|lowering) mlp/scan-o(n|ff)/none/L[23]", line)
               for line in pieces), pieces
