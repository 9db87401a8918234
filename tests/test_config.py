"""Config loading: YAML, dotted overrides, one-line errors naming the key."""

import pytest
import yaml

from dynalize.config import ConfigError, dump_config, load_config


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("steps: 7\ntrainer:\n  lr: 3.0e-5\n  loss: {name: ppo_clip}\n")
    cfg = load_config(path, ["trainer.lr=1e-6", "generator.temperature=0.7", "task.args.n_topics=3"])
    assert cfg.steps == 7
    assert cfg.trainer.lr == 1e-6
    assert cfg.trainer.loss.name == "ppo_clip"
    assert cfg.generator.temperature == 0.7
    assert cfg.task.args == {"n_topics": 3}


def test_defaults_follow_the_method():
    cfg = load_config(None)
    assert cfg.trainer.lr == 1e-6 and cfg.trainer.weight_decay == 0.01
    assert cfg.max_off_policy_steps == 8
    assert cfg.penalties.lam == 0.5
    assert cfg.trainer.loss.std_normalize is False


def test_overrides_alone_start_from_the_defaults_and_no_arguments_run_the_demo(tmp_path):
    from dynalize.run import DEFAULT_CONFIG, describe_base, parse_args, resolve_config

    bare = parse_args(["steps=3", "trainer.lr=1e-5"])
    assert resolve_config(bare) == load_config(None, ["steps=3", "trainer.lr=1e-5"])
    assert not resolve_config(bare).penalties.enabled  # config.py's defaults: the RM-only baseline
    assert describe_base(bare) == "dynalize/config.py defaults"
    demo = resolve_config(parse_args([]))
    assert demo == load_config(DEFAULT_CONFIG) and demo.penalties.enabled
    assert describe_base(parse_args([])) == "the built-in demo (dynalize/assets/default.yaml)"
    # docs/running.md's commands run in order: the demo, then `steps=50 ...` of config.py's defaults, each its own run
    assert demo.run_dir != resolve_config(bare).run_dir
    path = tmp_path / "x.yaml"
    path.write_text("steps: 7\n")
    assert resolve_config(parse_args(["--config", str(path), "seed=2"])).steps == 7
    assert describe_base(parse_args(["--config", str(path)])) == str(path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.lrr=1"], "config error: trainer.lrr: unknown key"),
        (["trainer.lr=fast"], "config error: trainer.lr: Input should be a valid number"),
        (["batch_size=10", "group_size=4"], "batch_size (10) must be a multiple of group_size (4)"),
        (["trainer.loss.name=sgd"], "config error: trainer.loss.name: should be 'prime' or 'ppo_clip', or 'module:function'"),
        (["steps"], "is not of the form key=value"),
    ],
)
def test_bad_config_gives_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["steps=5", "trainer.loss.clip_eps=0.3"])
    dump_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["trainer"]["loss"]["clip_eps"] == 0.3
