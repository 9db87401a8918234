"""`python -m dynalize.export RUN [--step N] --out DIR`: a trained policy as a plain model directory.

The policy of a checkpoint (the newest intact one, or `--step N`'s) is written out as what
`save_pretrained` writes: config, generation config, safetensors weights, the tokenizer and its
chat template, in the run's `policy.dtype` (a checkpoint of float32 master weights under a bf16
policy is cast; one already in that dtype is copied as it is). `AutoModelForCausalLM.from_pretrained(DIR)`, `vllm serve DIR` and every other tool
that reads the Hugging Face format load it unchanged; nothing of dynalize is needed. The
checkpoint is verified against its manifest first, and DIR is written whole or not at all.

A run exports its final policy to `<run>/final/` by itself when it ends (`export_final`).
A LoRA run's export is the merged model, with the adapter alone (peft's format) in `DIR/adapter/`.
Nothing is ever deleted: DIR must be missing, empty, or (with `--overwrite`) an earlier export,
which is then moved aside to `DIR.replaced-<time>`; a DIR that is or holds a run, or holds anything
else, is refused, and so is one inside a run or a checkpoint (links resolved; only a run's own
`final/` is its export's place). Each export carries a small marker file, `.dynalize-export.json`.

Exit codes: 0 written; 2 bad input (one line: no such run or checkpoint, a damaged one, DIR in use,
a `policy.dtype` in the run's config.yaml that is none; a full disk or a read-only DIR, naming
the path, with nothing left behind); 1 an unexpected error, with its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import types
import typing
from pathlib import Path

import structlog

from .checkpoint import checkpoints, damage
from .config import PolicyConfig, read_yaml
from .errors import ConfigError
from .runlog import enclosing_run, filesystem_problem, is_run_dir, move_aside, naming

log = structlog.get_logger("dynalize.export")


def find_checkpoint(run: Path, step: int | None = None) -> Path:
    """The checkpoint of `run` at `step` (its folder), or the newest intact one; ConfigError if none."""
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"{run} is not a run directory (no config.yaml)")
    found = checkpoints(run / "checkpoints")
    if step is not None:
        chosen = [p for p in found if p.name == f"step_{step:06d}"]
        if not chosen:
            have = ", ".join(str(int(p.name.removeprefix("step_"))) for p in reversed(found)) or "none"
            raise ConfigError(f"{run} has no checkpoint at step {step} (checkpoints at steps: {have})")
        if why := damage(chosen[0]):
            raise ConfigError(f"checkpoint {chosen[0]} is damaged: {why}")
        return chosen[0]
    for path in found:
        if (why := damage(path)) is None:
            return path
        log.warning("checkpoint.damaged", checkpoint=str(path), problem=why)
    raise ConfigError(f"{run} has no intact checkpoint to export")


MARKER = ".dynalize-export.json"
"""Written into every export: the mark that lets `--overwrite` move a folder aside (it is ours)."""


def out_problem(out: Path, run: Path, overwrite: bool) -> str | None:
    """Why `out` cannot receive an export of `run` (None if it can). Only an empty folder, a
    missing one, or with `overwrite` a previous export of ours (its marker, or a run's own
    `final/` from before markers) may be used: never a run, a folder holding one, or other files."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        return f"{out} exists and is not a folder: choose another --out"
    inside, o = enclosing_run(out), out.resolve()
    if inside is not None and o not in (run.resolve(), run.resolve() / "final"):  # a run's own final/ is its export
        what, folder = inside
        return (f"{out} is {'' if folder == o else 'inside '}the {what} {folder}: an export never writes into a run "
                f"or a checkpoint (a resume rewrites a run's files and replaces its checkpoints); choose another --out")
    if not out.exists() or not any(out.iterdir()):
        return None
    o, r = out.resolve(), run.resolve()
    if o == r or r.is_relative_to(o):
        return f"{out} is or holds the run {run}: choose another --out (an export never replaces a run)"
    if is_run_dir(out) or any(is_run_dir(p) for p in out.iterdir() if p.is_dir()) or (
            is_export(out) and any(is_run_dir(p.parent) for p in out.rglob("config.yaml"))):
        return f"{out} holds a run: choose another --out (an export never replaces a run)"
    if not is_export(out):
        return (f"{out} already holds files that are not an export of dynalize: choose another --out "
                f"(--overwrite only replaces an earlier export)")
    if not overwrite:
        return f"{out} already holds files: choose another --out, or pass --overwrite (the old export is moved aside)"
    return None


def is_export(folder: Path) -> bool:
    """An export of ours: its marker, or a run's `final/` written before markers (a bare model folder)."""
    legacy_final = (folder.name == "final" and (folder.parent / "config.yaml").is_file()
                    and (folder / "config.json").is_file() and not any(p.is_dir() for p in folder.iterdir()))
    return (folder / MARKER).is_file() or legacy_final


def export_policy(run: str | Path, out: str | Path, step: int | None = None, overwrite: bool = False,
                  checkpoint: Path | None = None) -> Path:
    """Copy the policy of `run`'s checkpoint (`find_checkpoint`) to `out`; returns `out`. Nothing
    is ever deleted: an `out` that holds files is refused (`out_problem`) unless it is an earlier
    export and `overwrite`, and that one is then moved aside (`<out>.replaced-<time>`) once the
    new copy is whole. `checkpoint`: one this process has just written, taken as it is
    (`find_checkpoint` would hash every file of it, optimizer state included, a second time)."""
    run, out = Path(run), Path(out)
    source = (checkpoint or find_checkpoint(run, step)) / "policy"
    if not (source / "config.json").is_file():
        raise ConfigError(f"{source} holds no model (no config.json)")
    if problem := out_problem(out, run, overwrite):
        raise ConfigError(problem)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=out.parent))  # ours alone: nothing else is removed
    tmp.rmdir()
    dtype = policy_dtype(run)
    try:
        with naming(tmp):  # a full disk or a read-only folder names where (safetensors raises its own error)
            _copy_policy(run, source, tmp, dtype)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # our own half-written copy
        raise
    if not has_chat_template(tmp):
        log.warning("export.no_chat_template", out=str(out),
                    why="the policy's tokenizer has none (nor had its base model): set one before chatting with it")
    if out.is_dir() and any(out.iterdir()):
        moved = move_aside(out)
        log.info("export: the earlier export was moved aside", out=str(out), moved_to=str(moved))
    elif out.is_dir():
        out.rmdir()  # empty
    tmp.rename(out)
    return out


def _copy_policy(run: Path, source: Path, tmp: Path, dtype: str) -> None:
    """The policy of `source` into `tmp` (a new folder) in `dtype`, a LoRA run's adapter beside it,
    and our marker."""
    if saved_dtype(source) == dtype:
        shutil.copytree(source, tmp)
    else:
        resave(source, tmp, dtype)
    if (source.parent / "adapter").is_dir():  # a LoRA run: the merged model above, its adapter beside
        shutil.copytree(source.parent / "adapter", tmp / "adapter")
    (tmp / MARKER).write_text(json.dumps({"run": str(run), "checkpoint": source.parent.name, "dtype": dtype}) + "\n")


def policy_dtype(run: Path) -> str:
    """The run's `policy.dtype` (its config.yaml; float32 where it names none); ConfigError for a
    value that is no dtype of `policy.dtype` (a hand-edited config.yaml)."""
    policy = read_yaml(run / "config.yaml").get("policy") or {}
    dtype = policy.get("dtype", "float32") if isinstance(policy, dict) else None
    allowed = typing.get_args(PolicyConfig.model_fields["dtype"].annotation)
    if dtype not in allowed:
        raise ConfigError(f"config error: {run / 'config.yaml'}: policy.dtype is {dtype!r}, not one of "
                          f"{', '.join(allowed)}: fix it there")
    return dtype


def saved_dtype(model_dir: Path) -> str | None:
    """The dtype a saved model's config.json names."""
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return config.get("dtype") or config.get("torch_dtype")


def resave(source: Path, out: Path, dtype: str) -> None:
    """The model and tokenizer of `source` saved again to `out`, the weights cast to `dtype`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(str(source), dtype=getattr(torch, dtype)).save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(out))


def has_chat_template(model_dir: Path) -> bool:
    """Whether the tokenizer saved in `model_dir` carries a chat template."""
    from transformers import AutoTokenizer

    return bool(AutoTokenizer.from_pretrained(str(model_dir)).chat_template)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dynalize.export", description=__doc__.splitlines()[0])
    ap.add_argument("run", metavar="RUN", help="the run directory (runs/<name>)")
    ap.add_argument("--step", type=int, help="the checkpoint after this many steps (default: the newest intact one)")
    ap.add_argument("--out", required=True, help="the model directory to write")
    ap.add_argument("--overwrite", action="store_true", help="replace --out if it holds an earlier export (moved aside to <out>.replaced-<time>, never deleted)")
    args = ap.parse_args(argv)
    try:
        out = export_policy(args.run, args.out, args.step, args.overwrite)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a read-only folder: our half-written copy is removed, nothing else touched
        if problem := filesystem_problem(e, "nothing was written there and nothing was replaced; fix the cause "
                                            "and export again"):
            print(f"error: {problem}", file=sys.stderr)
            return 2
        raise
    print(f"exported {out}: load it with AutoModelForCausalLM.from_pretrained({str(out)!r}) or `vllm serve {out}`")
    return 0


def export(run_dir: str | Path, out: str | Path, *, step: int | None = None, overwrite: bool = False) -> Path:
    """`python -m dynalize.export RUN --out OUT [--step N] [--overwrite]` from Python, as
    `dynalize.export(run_dir, out)`: the same rules (`out` new, empty, or with `overwrite` an
    earlier export, moved aside; a run never replaced; ConfigError with one line otherwise, also for
    arguments of the wrong type); returns `out`."""
    for name, value in (("run_dir", run_dir), ("out", out)):
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            raise ConfigError(f"dynalize.export: {name} must be a path, not {type(value).__name__} {value!r:.40}")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise ConfigError(f"dynalize.export: step must be a whole number of steps or None, not {step!r:.40}")
    if not isinstance(overwrite, bool):
        raise ConfigError(f"dynalize.export: overwrite must be True or False, not {overwrite!r:.40}")
    return export_policy(run_dir, out, step, overwrite)


class _CallableModule(types.ModuleType):
    """This module, callable as `export`: importing `dynalize.export` makes the package's
    attribute `export` this module, so `dynalize.export(run_dir, out)` must work on it too."""

    def __call__(self, run_dir: str | Path, out: str | Path, *, step: int | None = None,
                 overwrite: bool = False) -> Path:
        return export(run_dir, out, step=step, overwrite=overwrite)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
