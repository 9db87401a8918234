""".ci/run does what the README tells a new user: a fresh virtual environment, the README's install
command and its test command inside it, and the vLLM venv layered on that environment."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CI = (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def readme_commands() -> list[str]:
    """The commands of the README's "Two commands" section, one per bash block."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def ci_value(name: str) -> str:
    found = re.search(rf"^{name}='(.*)'$", CI, re.M)
    assert found, f".ci/run no longer sets {name}"
    return found.group(1)


def test_ci_installs_and_tests_with_the_readmes_own_commands():
    install, tests = readme_commands()
    assert install == ci_value("README_INSTALL") + " && python -m dynalize.run"
    assert tests == ci_value("README_TESTS")


def test_ci_builds_a_fresh_environment_before_installing_and_runs_everything_inside_it():
    lines = [line.strip() for line in CI.splitlines() if line.strip() and not line.strip().startswith("#")]
    fresh = next(i for i, line in enumerate(lines) if re.search(r"-m venv --clear \.venv-ci$", line))
    activate = lines.index("source .venv-ci/bin/activate")
    install = lines.index('eval "$README_INSTALL -q"')
    tests = lines.index('eval "run_pytest $README_TESTS -q"')
    assert fresh < activate < install < tests
    assert 'PYTHON="$PWD/.venv-ci/bin/python" bash scripts/install_vllm_cpu.sh' in lines  # layered on .venv-ci
    assert not re.search(r"^\s*python -m pip", CI, re.M)  # nothing installed into whatever `python` is first
