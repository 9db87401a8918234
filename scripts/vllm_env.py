"""The vLLM-on-CPU virtualenv's two helpers, used by `scripts/install_vllm_cpu.sh`.

    python scripts/vllm_env.py share VENV             # VENV sees this interpreter's packages
    VENV/bin/python scripts/vllm_env.py check [--vllm VERSION]

`share`, run by the Python environment dynalize is installed in (a virtualenv, conda or uv env, or
the system Python), writes a `.pth` file into VENV that adds this environment's site directories
after VENV's own (`site.addsitedir`, so their `.pth` files, e.g. an editable dynalize, work too).
VENV's own packages (vLLM and what it pins) come first; the environment itself is never changed.

`check` says whether this interpreter can run the vLLM tests and benchmark: every runtime
requirement of dynalize (pyproject.toml) is installed at an allowed version and imports, and
every module that tests/test_vllm.py, tests/conftest.py and benchmarks/generation.py import
(anywhere in them) imports. With `--vllm VERSION`, also vLLM at that version with a CPU torch,
as dynalize's engine imports it. One line per problem, exit status 1 if any.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata as metadata
import os
import site
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
USERS = ["tests/conftest.py", "tests/test_vllm.py", "benchmarks/generation.py"]
"""The files run with the vLLM venv's python: everything they import must import there."""
PTH_NAME = "dynalize-shared-env.pth"


def site_dirs() -> list[str]:
    """This interpreter's site directories (a venv with system site packages: both)."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def share(venv: Path) -> int:
    """Make `venv` see this interpreter's packages, after its own."""
    venv = venv.resolve()
    if Path(sys.prefix).resolve() == venv:
        print(f"vllm_env: run `share` with the Python that has dynalize, not with {venv}'s own", file=sys.stderr)
        return 2
    probe = "import sys, sysconfig; print(sys.version_info[:2]); print(sysconfig.get_path('purelib'))"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], check=True, capture_output=True, text=True)
    version, purelib = out.stdout.splitlines()
    if version != str(sys.version_info[:2]):
        print(f"vllm_env: {venv} runs Python {version}, this environment {sys.version_info[:2]}: "
              f"its packages would not load there (remove {venv} and re-run)", file=sys.stderr)
        return 2
    lines = [f"import site; site.addsitedir({d!r})" for d in site_dirs()]
    header = f"# Written by dynalize's scripts/vllm_env.py: the packages of {sys.prefix}, after this venv's own.\n"
    (Path(purelib) / PTH_NAME).write_text(header + "\n".join(lines) + "\n", encoding="utf-8")
    print(f"vllm_env: {venv} sees the packages of {sys.prefix}")
    return 0


def _import_names() -> dict[str, list[str]]:
    """Distribution name (normalised) -> the top-level modules it installs."""
    names: dict[str, list[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            names.setdefault(_normalise(dist), []).append(module)
    return names


def _normalise(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def requirement_problems() -> list[str]:
    """dynalize's runtime requirements that are missing, at a version out of range, or do not import."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # transformers needs it too: nothing of dynalize's works here
        return ["packaging: not installed (dynalize's dependencies are not installed in this environment)"]

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    modules = _import_names()
    problems = []
    for line in project["dependencies"]:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{req.name}: not installed (dynalize needs {req})")
            continue
        if not req.specifier.contains(version, prereleases=True):
            where = metadata.distribution(req.name).locate_file("")
            problems.append(f"{req.name} {version} (in {where}) is outside dynalize's range: {req}")
            continue
        tops = [m for m in modules.get(_normalise(req.name), []) if not m.startswith("_")]
        exact = [m for m in tops if _normalise(m) == _normalise(req.name)]
        for module in exact or tops:
            problems += [f"{req.name} {version}: {e}" for e in _import(module)]
    return problems


def imported_modules(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every absolute import in `path`, module level or inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            found += [(node.module, a.name) for a in node.names]
    return found


def _import(module: str, name: str | None = None) -> list[str]:
    """[] if `import module` (`from module import name`) works, else one line saying why not."""
    try:
        mod = importlib.import_module(module)
        if name is not None and name != "*" and not hasattr(mod, name):
            importlib.import_module(f"{module}.{name}")
    except Exception as e:  # noqa: BLE001 - any failure to import is the finding
        target = f"from {module} import {name}" if name else f"import {module}"
        return [f"`{target}` fails: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
    return []


def import_problems(with_vllm: bool) -> list[str]:
    """Imports of the files run with the vLLM venv that fail here (vLLM's own only `with_vllm`),
    one line per distinct error."""
    for folder in (ROOT, ROOT / "tests"):  # as `python -m pytest` from the checkout sees them
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    errors: dict[str, str] = {}
    for rel in USERS:
        for module, name in dict.fromkeys(imported_modules(ROOT / rel)):
            if with_vllm or module.split(".")[0] != "vllm":
                for error in _import(module, name):
                    errors.setdefault(error.partition(" fails: ")[2], f"{rel}: {error}")
    return list(errors.values())


def vllm_problems(version: str) -> list[str]:
    """vLLM importable as dynalize's engine imports it, at `version`, on a CPU torch."""
    import torch

    problems = [] if torch.__version__.endswith("+cpu") else [f"torch {torch.__version__} is not a CPU build"]
    from dynalize.backends.vllm import vllm_available

    if not vllm_available():  # imports vLLM in the CPU environment the engines set
        try:
            from vllm import LLM  # noqa: F401 - the lazy attribute that loads the engine
        except Exception as e:  # noqa: BLE001
            return problems + [f"vllm does not import: {type(e).__name__}: {e}"]
        return problems + ["dynalize.backends.vllm.vllm_available() is False"]
    import vllm

    if vllm.__version__.split("+")[0] != version:
        problems.append(f"vllm {vllm.__version__} installed, {version} wanted")
    return problems


def check(version: str | None) -> int:
    problems = requirement_problems() + import_problems(with_vllm=version is not None)
    if version is not None:
        problems += vllm_problems(version)
    for p in dict.fromkeys(problems):
        print(f"vllm_env check ({sys.prefix}): {p}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("share", help="make VENV see this interpreter's packages").add_argument("venv", type=Path)
    sub.add_parser("check", help="can this interpreter run the vLLM tests?").add_argument(
        "--vllm", metavar="VERSION", help="also require vLLM at this version on a CPU torch")
    args = ap.parse_args(argv)
    return share(args.venv) if args.command == "share" else check(args.vllm)


if __name__ == "__main__":
    sys.exit(main())
