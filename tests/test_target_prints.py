"""A target that prints (at import, while lowering; from Python and from C) never reaches the command's stdout:
that is the report, a JSON document a pipeline parses (MaxText prints "[DECOUPLED NO-OP] gcs_storage: using
stubs." from an import). What it printed shows on stderr instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

NOISY = textwrap.dedent('''
    import ctypes
    import os

    print("noisy: imported")
    from hlo_audit.examples import nnx_mlp


    def lower(cell):
        print("noisy: lowering", cell.id)
        os.write(1, b"noisy: from C, on fd 1\\n")  # what a C++ library's printf does
        return nnx_mlp.lower(cell)
''')


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_what_a_target_prints_goes_to_stderr(tmp_path, jobs):
    (tmp_path / "noisy.py").write_text(NOISY)
    (tmp_path / "hlo-audit.toml").write_text('target = "noisy:lower"\nmodels = ["mlp"]\nquant = ["none"]\n'
                                             'layers = [2, 3]\n')
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    proc = subprocess.run([sys.executable, "-m", "hlo_audit", "run", "--format", "json", "--jobs", jobs],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)  # nothing before or after the document
    assert [c["status"] for c in doc["cells"]] == ["ok"] * 4
    assert "noisy: imported" in proc.stderr and "noisy: lowering mlp/scan-off/none/L2" in proc.stderr
    assert "noisy: from C, on fd 1" in proc.stderr
