"""The vLLM-on-CPU venv sees the environment dynalize is installed in (a virtualenv, not only the
base interpreter), and its check names what the vLLM tests would miss (scripts/vllm_env.py,
scripts/install_vllm_cpu.sh). Venvs here are made without pip: nothing is installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "scripts" / "vllm_env.py"


def _venv(path: Path, python: str = sys.executable) -> Path:
    subprocess.run([python, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def _site(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def _run(*cmd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what the venvs hold
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd="/")


def test_vllm_venv_sees_the_active_virtualenvs_packages(tmp_path):
    user = _venv(tmp_path / "user")  # the user's virtualenv, without system site packages
    (_site(user) / "only_in_user_env.py").write_text("WHERE = 'user env'\n")
    editable = tmp_path / "checkout"
    editable.mkdir()
    (editable / "editable_pkg.py").write_text("WHERE = 'checkout'\n")
    (_site(user) / "__editable__.editable_pkg.pth").write_text(f"{editable}\n")
    vllm = _venv(tmp_path / "vllm", str(user))

    assert _run(vllm, "-c", "import only_in_user_env").returncode != 0
    shared = _run(user, HELPER, "share", tmp_path / "vllm")
    assert shared.returncode == 0, shared.stderr
    seen = _run(vllm, "-c", "import only_in_user_env, editable_pkg; print(only_in_user_env.WHERE, editable_pkg.WHERE)")
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.split() == ["user", "env", "checkout"]


def test_vllm_venvs_own_packages_come_first(tmp_path):
    user = _venv(tmp_path / "user")
    (_site(user) / "pinned.py").write_text("WHERE = 'user'\n")
    vllm = _venv(tmp_path / "vllm", str(user))
    (_site(vllm) / "pinned.py").write_text("WHERE = 'vllm'\n")
    assert _run(user, HELPER, "share", tmp_path / "vllm").returncode == 0
    assert _run(vllm, "-c", "import pinned; print(pinned.WHERE)").stdout.strip() == "vllm"


def test_share_refuses_the_vllm_venvs_own_python(tmp_path):
    vllm = _venv(tmp_path / "vllm")
    done = _run(vllm, HELPER, "share", tmp_path / "vllm")
    assert done.returncode == 2 and "not with" in done.stderr


def test_check_names_a_dependency_the_vllm_tests_would_miss(tmp_path):
    vllm = _venv(tmp_path / "vllm")
    assert _run(sys.executable, HELPER, "share", tmp_path / "vllm").returncode == 0
    ok = _run(vllm, HELPER, "check")
    assert ok.returncode == 0, ok.stderr
    # In the vLLM venv's own site-packages (first on its path): structlog broken, transformers too new.
    (_site(vllm) / "structlog.py").write_text("raise ImportError(\"No module named 'structlog'\")\n")
    dist = _site(vllm) / "transformers-9.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 9.0.0\n")
    bad = _run(vllm, HELPER, "check")
    assert bad.returncode == 1
    assert "No module named 'structlog'" in bad.stderr
    assert "transformers 9.0.0" in bad.stderr and "outside dynalize's range" in bad.stderr


def test_install_script_stops_when_the_environment_lacks_dynalize(tmp_path):
    if "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("the script stops earlier on a CPU without AVX2")
    bare = _venv(tmp_path / "bare")  # a virtualenv where dynalize was never installed
    done = subprocess.run(["bash", str(ROOT / "scripts" / "install_vllm_cpu.sh"), str(tmp_path / "vllm")],
                          capture_output=True, text=True, env={**os.environ, "PYTHON": str(bare), "PYTHONPATH": ""})
    assert done.returncode == 1
    assert "install dynalize into that environment first" in done.stderr
    assert "No module named 'torch'" in done.stderr
    assert not (tmp_path / "vllm").exists()
