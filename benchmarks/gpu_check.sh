#!/usr/bin/env bash
# GPU check (issue 6): dynalize (VLLMGenerator + AccelerateLearner) vs TRL's GRPOTrainer (vLLM
# colocate mode) on one GPU, same random-init policy of Qwen3-0.6B size, 5 optimizer steps each:
# 64 rollouts per step (8 prompts × 8), up to 128 new tokens, temperature 1, lr 1e-6, bf16.
#
#   bash benchmarks/gpu_check.sh            # needs a CUDA GPU with vllm (GPU build), trl, datasets
#
# Nothing is downloaded: config.json is written here (Qwen3-0.6B's shape: 28 layers, hidden 1024,
# 16 query / 8 KV heads of 128, MLP 3072, vocab 151936, tied embeddings) and the tokenizer is the
# tiny one trained offline (dynalize.tiny), its vocabulary padded to 151936 with decodable tokens.
# Prints step time and completion tokens/s per framework (steps 2-5; step 1 is warm-up) and their
# ratio. Budget: < 8 min; every stage has a timeout, and any failure stops the script.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python}"
OUT="${OUT:-$(mktemp -d)}/gpu_check"
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"  # tests/toytask.py: the shared toy task
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0
STEPS=5
echo "== gpu_check: output in $OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 120 "$PY" -c "import torch, vllm, trl, datasets; assert torch.cuda.is_available(), 'no CUDA device'; \
print('torch', torch.__version__, '| vllm', vllm.__version__, '| trl', trl.__version__)"

echo "== building the Qwen3-0.6B-size random-init model"
timeout 240 "$PY" - "$OUT/model" <<'EOF'
import json, sys, torch
from pathlib import Path
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
from dynalize import tiny
out = Path(sys.argv[1]); VOCAB = 151936
tok = AutoTokenizer.from_pretrained(tiny.resolve("tiny:policy"))
tok.save_pretrained(out)
spec = json.loads((out / "tokenizer.json").read_text())
vocab = spec["model"]["vocab"]
n = max(vocab.values()) + 1
vocab.update({f"Ġ<{i}>": i for i in range(n, VOCAB)})  # no merge makes them: decodable, never encoded
(out / "tokenizer.json").write_text(json.dumps(spec))
tok = AutoTokenizer.from_pretrained(out)
assert len(tok) == VOCAB, len(tok)
cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                  rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
torch.manual_seed(0)
with torch.device("cuda"):
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out)
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters -> {out}")
EOF

echo "== dynalize: vllm generator + accelerate learner, $STEPS steps"
timeout 240 "$PY" - "$OUT" "$STEPS" <<'EOF'
import sys
from dynalize import build, run
out, steps = sys.argv[1], sys.argv[2]
if "vllm" not in build.GENERATORS:  # until build.py registers the engine
    from dynalize.backends.vllm import build_vllm_generator
    original = build.build_generator
    def build_generator(cfg):
        g = cfg.generator
        if g.engine != "vllm":
            return original(cfg)
        return build_vllm_generator(cfg.policy.path, cfg.policy.dtype, gpu_memory_utilization=0.3,
                                    max_model_len=1024, temperature=g.temperature, top_p=g.top_p, min_p=g.min_p)
    build.build_generator = build_generator
    build.GENERATORS.append("vllm")
sys.exit(run.main([
    f"output_dir={out}/runs", "name=dynalize", f"steps={steps}", "batch_size=64", "group_size=8",
    "progress=false", "checkpoint_every=0", "eval_every=0", "penalties.enabled=false",
    "task.name=toytask:ToyTask", "reward_model.engine=task", f"policy.path={out}/model", "policy.dtype=bfloat16",
    "generator.engine=vllm", "generator.max_new_tokens=128", "generator.temperature=1.0",
    "trainer.lr=1e-6", "trainer.micro_batch_size=16",
]))
EOF

echo "== TRL GRPOTrainer, vllm_mode=colocate, $STEPS steps"
timeout 300 "$PY" - "$OUT" "$STEPS" <<'EOF'
import json, sys, time
import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from toytask import TOPICS, vowel_share
out, steps = sys.argv[1], int(sys.argv[2])
data = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Write about the {t}."}] for t in TOPICS] * 40})

def reward(completions, **_):
    return [vowel_share(c[-1]["content"] if isinstance(c, list) else c) for c in completions]

class Clock(TrainerCallback):
    def __init__(self):
        self.rows, self.t = [], None
    def on_step_begin(self, args, state, control, **kw):
        self.t = time.perf_counter()
    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "completions/mean_length" in logs:
            self.rows.append({"step": state.global_step, "gen_len": logs["completions/mean_length"]})
    def on_step_end(self, args, state, control, **kw):
        self.rows.append({"step": state.global_step, "time": time.perf_counter() - self.t})

clock = Clock()
cfg = GRPOConfig(
    output_dir=f"{out}/trl", max_steps=steps, per_device_train_batch_size=16, gradient_accumulation_steps=4,
    num_generations=8, max_completion_length=128, temperature=1.0, learning_rate=1e-6, weight_decay=0.01,
    beta=0.0, bf16=True, logging_steps=1, save_strategy="no", report_to="none", seed=0,
    use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, vllm_max_model_length=1024,
    model_init_kwargs={"dtype": torch.bfloat16},
)
trainer = GRPOTrainer(model=f"{out}/model", reward_funcs=reward, args=cfg, train_dataset=data, callbacks=[clock])
trainer.train()
steps_ = {}
for r in clock.rows:
    steps_.setdefault(r["step"], {}).update(r)
with open(f"{out}/trl_steps.jsonl", "w") as f:
    for s in sorted(steps_):
        f.write(json.dumps(steps_[s]) + "\n")
EOF

echo "== summary"
timeout 60 "$PY" - "$OUT" <<'EOF'
import json, statistics, sys
out = sys.argv[1]
dyn = [json.loads(l) for l in open(f"{out}/runs/dynalize/metrics.jsonl")]
trl = [json.loads(l) for l in open(f"{out}/trl_steps.jsonl")]
def summary(rows, time_key, len_key):
    rows = [r for r in rows[1:] if time_key in r and len_key in r]  # first step: warm-up
    step = statistics.fmean(r[time_key] for r in rows)
    tokens = statistics.fmean(r[len_key] * 64 / r[time_key] for r in rows)
    return step, tokens, len(rows)
d_step, d_tok, dn = summary(dyn, "time/step", "gen_len/mean")
t_step, t_tok, tn = summary(trl, "time", "gen_len")
print(f"{'framework':<34}{'steps':>6}{'step s':>10}{'completion tokens/s':>22}")
print(f"{'dynalize (vllm + accelerate)':<34}{dn:>6}{d_step:>10.2f}{d_tok:>22.0f}")
print(f"{'TRL GRPOTrainer (vllm colocate)':<34}{tn:>6}{t_step:>10.2f}{t_tok:>22.0f}")
print(f"ratio dynalize / TRL: tokens/s {d_tok / t_tok:.2f}x, step time {d_step / t_step:.2f}x")
EOF
