"""Generation speed: HFGenerator vs VLLMGenerator, tokens/s and weight-sync time (issue 6).

    .venv-vllm/bin/python benchmarks/generation.py [--batch 64] [--new-tokens 128] [--rounds 2]
                                                   [--threads N] [--json out.json]

(`.venv-vllm`: made by `bash scripts/install_vllm_cpu.sh`; any python runs the HF rows.)

Two models, both built locally (nothing downloaded): the tiny policy (`tiny:policy`) and a
~3 M-parameter Qwen2 (hidden 256, 4 layers, 8 heads of 32, random init, the tiny tokenizer).
For each: one warm-up batch, then `--rounds` timed batches of `--batch` prompts × `--new-tokens`
new tokens at temperature 1 (EOS still stops a reply; tokens/s counts the tokens produced), per
engine. Weight sync: the learner's state pushed into the engine (`update_weights`; for vLLM also the
/dev/shm safetensors path that a separate engine process or RemoteGenerator uses), median of 5.

On a shared 2-core box numbers move with the load; the load average is printed with the table.
Without vLLM installed only the HF rows are shown.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from dynalize import tiny  # noqa: E402
from dynalize.backends.base import SamplingParams  # noqa: E402

MEDIUM_ARCH = {"hidden": 256, "layers": 4, "heads": 8, "kv_heads": 2, "intermediate": 768, "max_positions": 1024}


def build_medium(out: Path) -> str:
    """A ~3 M-parameter random-init Qwen2 with the tiny policy's tokenizer."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(tiny.resolve("tiny:policy"))
    cfg = tiny.qwen2_config(len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **MEDIUM_ARCH)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def n_params(path: str) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny.resolve(path)).parameters())


def prompts(batch: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(10, 400, (int(torch.randint(4, 17, (1,), generator=g)),), generator=g).tolist()
            for _ in range(batch)]


def perturbed_state(path: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny.resolve(path))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    return model.state_dict()


async def measure(gen, batch: list[list[int]], new_tokens: int, rounds: int, state: dict[str, Any]) -> dict[str, float]:
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=0)
    await gen.generate(batch[:8], SamplingParams(max_new_tokens=16, seed=1))  # warm-up
    times, tokens = [], []
    for r in range(rounds):
        sampling.seed = r
        start = time.perf_counter()
        outs = await gen.generate(batch, sampling)
        times.append(time.perf_counter() - start)
        tokens.append(sum(len(c.token_ids) for c in outs))
    syncs = []
    for v in range(5):
        start = time.perf_counter()
        await gen.update_weights(state, v + 1)
        syncs.append(time.perf_counter() - start)
    return {"tokens_per_s": sum(tokens) / sum(times), "s_per_batch": statistics.fmean(times),
            "tokens_per_batch": statistics.fmean(tokens), "sync_ms": 1e3 * statistics.median(syncs)}


async def vllm_disk_sync_ms(gen, state: dict[str, Any]) -> float:
    engine = gen.engine
    engine.in_memory_reload = False  # the path taken when the engine core runs in another process
    try:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            await engine.run(engine.load_weights, state)
            times.append(time.perf_counter() - start)
    finally:
        engine.in_memory_reload = True
    return 1e3 * statistics.median(times)


def have_vllm() -> bool:
    try:
        from dynalize.backends.vllm import vllm_available

        return vllm_available()
    except Exception:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch intra-op threads")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from dynalize.run import setup_logging

    setup_logging("WARNING")
    torch.set_num_threads(args.threads)
    vllm_ok = have_vllm()
    rows: list[dict[str, Any]] = []
    batch = prompts(args.batch)
    with tempfile.TemporaryDirectory() as tmp:
        models = {"tiny:policy": tiny.resolve("tiny:policy"), "qwen2-3M": build_medium(Path(tmp) / "medium")}
        for name, path in models.items():
            params = n_params(path)
            state = perturbed_state(path)
            from dynalize.backends.hf import HFGenerator

            hf = HFGenerator(path, batch_size=args.batch, device="cpu")
            rows.append({"model": name, "params": params, "engine": "hf",
                         **anyio.run(measure, hf, batch, args.new_tokens, args.rounds, state)})
            del hf
            if vllm_ok:
                from dynalize.backends.vllm import VLLMGenerator

                start = time.perf_counter()
                gen = VLLMGenerator(path, max_model_len=512)
                startup = time.perf_counter() - start
                result = anyio.run(measure, gen, batch, args.new_tokens, args.rounds, state)
                result["disk_sync_ms"] = anyio.run(vllm_disk_sync_ms, gen, state)
                rows.append({"model": name, "params": params, "engine": "vllm", "startup_s": startup, **result})
                anyio.run(gen.close)

    table = Table(title=f"generation: batch {args.batch} × {args.new_tokens} new tokens, temperature 1, "
                        f"{args.threads} thread(s), load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for col in ("model", "params", "engine", "start-up s", "tokens/s", "s / batch", "tokens / batch",
                "weight sync ms", "vLLM ÷ HF"):
        table.add_column(col, justify="left" if col in ("model", "engine") else "right")
    hf_rate = {r["model"]: r["tokens_per_s"] for r in rows if r["engine"] == "hf"}
    for r in rows:
        sync = f"{r['sync_ms']:.1f}"
        if "disk_sync_ms" in r:
            sync += f" (disk {r['disk_sync_ms']:.1f})"
        ratio = f"{r['tokens_per_s'] / hf_rate[r['model']]:.2f}×" if r["engine"] == "vllm" else ""
        startup = f"{r['startup_s']:.1f}" if "startup_s" in r else ""
        table.add_row(r["model"], f"{r['params'] / 1e6:.2f} M", r["engine"], startup, f"{r['tokens_per_s']:.0f}",
                      f"{r['s_per_batch']:.2f}", f"{r['tokens_per_batch']:.0f}", sync, ratio)
    console = Console(width=max(Console().width, 120))
    console.print(table)
    if not vllm_ok:
        console.print("vLLM not installed: bash scripts/install_vllm_cpu.sh, then run with .venv-vllm/bin/python")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
