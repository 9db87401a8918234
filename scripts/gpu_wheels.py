"""Wheels for the lent GPU machine, which has no network: fetched here, carried with the work tree.

    python scripts/gpu_wheels.py [download]        # here: fill .whl/ and check the 64 MiB limit
    python3 scripts/gpu_wheels.py install DIR      # there: install what the machine lacks into DIR

The GPU machine has Python 3.12 and `MACHINE_HAS` (and what those require). `download` takes
dynalize's runtime requirements (pyproject.toml) plus TRL and datasets (the comparison in
benchmarks/gpu_check.py), skips what the machine has, and fetches the rest and their own
requirements, one version each, as wheels for CPython 3.12 on manylinux x86-64 (pure-Python wheels
where there are no others) into the git-ignored `.whl/`. A name installed here is fetched at the
version installed here (what the tests ran with); others at the newest release allowed. Wheels no
longer needed are removed. Then it adds up `.whl/` and the work tree as the device tool sends it
(tracked and untracked-not-ignored files) and fails if they pass `LIMIT_MIB`.

`install` needs only the standard library: it installs, with pip (no index, no dependencies) or,
without pip, by unpacking, each wheel whose distribution the running Python does not already have
(what the machine has is never shadowed), prints what it installed and what it found already
there, and, with `packaging` (transformers requires it), each requirement of the carried wheels
that the machine's versions do not meet.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
LIMIT_MIB = 64
PYTHON = "3.12"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
MACHINE_HAS = ["torch", "transformers", "accelerate", "anyio", "httpx", "rich", "pyyaml", "matplotlib",
               "pyarrow", "safetensors", "tokenizers", "pytest"]
"""What the lent GPU machine has installed (the issue's list); what these require is there too."""
MACHINE_LACKS = ["vllm", "trl", "datasets", "pydantic", "structlog", "tenacity", "json-repair"]
"""What it is known to lack, whatever the packages above require as installed here (typer, which
transformers requires, requires pydantic in the version installed here)."""
EXTRA_ROOTS = ["trl", "datasets"]
"""For the side-by-side comparison with TRL's GRPOTrainer (datasets: its training data)."""
TARGET_ENV = {"python_version": PYTHON, "python_full_version": f"{PYTHON}.0", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "sys_platform": "linux", "os_name": "posix",
              "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> tuple[str, str]:
    """(canonical distribution name, version) from a wheel's file name."""
    dist, version = path.name.split("-")[:2]
    return canonical(dist), version


def wheel_requirements(path: Path) -> list[str]:
    """The wheel's own `Requires-Dist` lines."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def needed(requirements: list[str]):
    """The requirements that apply on the target (CPython 3.12 on Linux x86-64, no extras)."""
    from packaging.requirements import Requirement

    for text in requirements:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(TARGET_ENV):
            yield req


def machine_closure() -> set[str]:
    """`MACHINE_HAS` and what they require, transitively, as installed here (names only), short
    of `MACHINE_LACKS` and what only those require."""
    lacks = {canonical(n) for n in MACHINE_LACKS}
    seen: set[str] = set()
    todo = list(MACHINE_HAS)
    while todo:
        name = canonical(todo.pop())
        if name in seen or name in lacks:
            continue
        seen.add(name)
        try:
            todo += [r.name for r in needed(md.requires(name) or [])]
        except md.PackageNotFoundError:
            pass  # not installed here: its own requirements are not known, the name alone is kept
    return seen


def roots() -> list[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [*project["dependencies"], *EXTRA_ROOTS]


def pinned(req) -> str:
    """`name==version` installed here if that satisfies `req`, else `req` itself (pip picks the newest)."""
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        return f"{req.name}{req.specifier}"
    return f"{req.name}=={version}" if req.specifier.contains(version, prereleases=True) else f"{req.name}{req.specifier}"


def fetch(spec: str) -> Path:
    """Download one wheel (no dependencies) for the target into `.whl/`; returns its path."""
    before = set(WHEELS.glob("*.whl"))
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", PYTHON, "--implementation", "cp", *platforms, "-d", str(WHEELS), spec]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"error: pip download {spec} failed:\n{result.stderr.strip()}")
    new = set(WHEELS.glob("*.whl")) - before
    if new:
        return new.pop()
    name = canonical(re.split(r"[<>=!~ ;\[]", spec, maxsplit=1)[0])  # pip found it already in .whl/
    return next(p for p in before if wheel_name(p)[0] == name)


def download() -> dict[str, Path]:
    """Fill `.whl/` with the closure; returns {name: wheel}."""
    from packaging.requirements import Requirement

    WHEELS.mkdir(exist_ok=True)
    have = machine_closure()
    chosen: dict[str, Path] = {}
    todo = [r for r in needed(roots())]
    while todo:
        req = todo.pop(0)
        name = canonical(req.name)
        if name in have or name in chosen:
            continue
        present = [p for p in WHEELS.glob("*.whl") if wheel_name(p)[0] == name]
        spec = pinned(req)
        exact = Requirement(spec)
        keep = next((p for p in present if exact.specifier.contains(wheel_name(p)[1], prereleases=True)), None)
        chosen[name] = keep or fetch(spec)
        print(f"  {chosen[name].name}" + ("" if keep else "  (downloaded)"))
        todo += list(needed(wheel_requirements(chosen[name])))
    for p in WHEELS.glob("*.whl"):  # one version of each, nothing no longer needed
        if p not in chosen.values():
            p.unlink()
            print(f"  removed {p.name}")
    return chosen


def tree_bytes() -> int:
    """What the device tool sends of the work tree: tracked and untracked-not-ignored files."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return sum((ROOT / f).stat().st_size for f in out.split("\0") if f and (ROOT / f).is_file())


def check_size() -> int:
    wheels = sum(p.stat().st_size for p in WHEELS.glob("*.whl"))
    tree = tree_bytes()
    mib = 1024 * 1024
    print(f"wheels {wheels / mib:.1f} MiB + work tree {tree / mib:.1f} MiB = {(wheels + tree) / mib:.1f} MiB "
          f"(limit {LIMIT_MIB} MiB)")
    if wheels + tree > LIMIT_MIB * mib:
        print(f"error: over the {LIMIT_MIB} MiB the device tool carries", file=sys.stderr)
        return 1
    return 0


def install(target: Path, wheels: Path = WHEELS) -> int:
    """Install each wheel in `wheels` whose distribution this Python lacks into `target`."""
    todo = []
    for path in sorted(wheels.glob("*.whl")):
        name, version = wheel_name(path)
        try:
            print(f"  have    {name} {md.version(name)} (carried {version})")
        except md.PackageNotFoundError:
            todo.append(path)
            print(f"  install {name} {version}")
    unmet = unmet_requirements(wheels, {wheel_name(p)[0]: wheel_name(p)[1] for p in todo})
    for line in unmet:
        print(f"  warning: {line}")
    if todo and importlib.util.find_spec("pip") is None:
        print("  no pip here: the wheels are unpacked as they are")
        for path in todo:
            unpack(path, target)
    elif todo:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--target", str(target), *map(str, todo)]
        if subprocess.run(cmd).returncode:
            print("error: pip install of the carried wheels failed", file=sys.stderr)
            return 1
    print(f"{len(todo)} wheel(s) installed into {target}, {len(list(wheels.glob('*.whl'))) - len(todo)} already here")
    return 0


def unpack(wheel: Path, target: Path) -> None:
    """Install a wheel without pip: its files go to `target`, those of `<name>.data/purelib` and
    `platlib` too (scripts and headers are left out: nothing here runs or compiles them)."""
    with zipfile.ZipFile(wheel) as z:
        for member in z.infolist():
            parts = Path(member.filename).parts
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            dest = target.joinpath(*parts)
            if member.is_dir():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(z.read(member))


def unmet_requirements(wheels: Path, installing: dict[str, str]) -> list[str]:
    """Requirements of the carried wheels that this Python will not meet, one line each: what the
    machine has may be older than what a carried wheel asks for (it is used as it is)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return ["packaging is not installed: the carried wheels' requirements were not checked"]
    lines = []
    for path in sorted(wheels.glob("*.whl")):
        for text in wheel_requirements(path):
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            name = canonical(req.name)
            try:
                version = installing.get(name) or md.version(name)
            except md.PackageNotFoundError:
                lines.append(f"{path.name} needs {req}: not installed, not carried")
                continue
            if not req.specifier.contains(version, prereleases=True):
                lines.append(f"{path.name} needs {req}: {name} {version} is what there is")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command")
    sub.add_parser("download", help="fill .whl/ here and check the size (the default)")
    inst = sub.add_parser("install", help="on the GPU machine: install the carried wheels it lacks")
    inst.add_argument("target", type=Path)
    inst.add_argument("--wheels", type=Path, default=WHEELS)
    args = ap.parse_args(argv)
    if args.command == "install":
        return install(args.target, args.wheels)
    print(f"wheels for CPython {PYTHON} on manylinux x86-64 into {WHEELS.relative_to(ROOT)}/:")
    download()
    return check_size()


if __name__ == "__main__":
    sys.exit(main())
