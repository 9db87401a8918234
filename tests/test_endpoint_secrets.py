"""No key on screen or on disk: a key put in an endpoint URL is refused as a pasted key is (one
line, exit 2, never echoed, nothing written), and whatever an endpoint sends back that looks like
a credential (its echo of the Authorization header, a key in a URL) is masked, in the preflight's
line as mid-run. Real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from dynalize.backends.base import EngineError
from dynalize.backends.config import ChatModelConfig
from dynalize.backends.openai import OpenAIChatModel
from dynalize.run import main
from faultserver import FaultServer, send

KEY = "sk-live-0123456789abcdefSECRET"
OPAQUE = "opaque-token-42"  # a key of no known format: masked because a request sent it


def toy(tmp_path, *extra):
    return [f"output_dir={tmp_path}", "name=run", "steps=2", "batch_size=8", "group_size=4", "progress=false",
            "generator.max_new_tokens=8", "task.name=toytask:ToyTask", "reward_model.engine=task",
            "checkpoint_every=0", "torch_threads=1", *extra]


def judge(url, key_env="null"):
    return ["penalties.enabled=true", "penalties.judge.engine=llm", f"penalties.judge.chat.base_url={url}",
            "penalties.judge.chat.model=judge", f"penalties.judge.chat.api_key_env={key_env}"]


def one_error_line(argv, capsys, tmp_path) -> str:
    assert main(argv) == 2
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not (tmp_path / "run").exists()  # no config.yaml written either
    return err[0] + out.out


@pytest.mark.parametrize("url", [f"http://user:{KEY}@127.0.0.1:9/v1", f"http://127.0.0.1:9/v1?api-key={KEY}",
                                 "http://127.0.0.1:9/v1?key=plainvalue123", f"http://{KEY}@127.0.0.1:9/v1"])
def test_a_key_inside_base_url_is_refused_unechoed_before_anything_is_written(url, capsys, tmp_path):
    line = one_error_line(toy(tmp_path, *judge(url)), capsys, tmp_path)
    assert "penalties.judge.chat.base_url" in line and "api_key_env" in line
    assert KEY not in line and "plainvalue123" not in line


def test_a_key_inside_a_remote_generator_url_is_refused_unechoed(capsys, tmp_path):
    line = one_error_line(toy(tmp_path, "generator.engine=remote", f"generator.base_urls=[http://u:{KEY}@h:8000]"),
                          capsys, tmp_path)
    assert "generator.base_urls" in line and KEY not in line


def test_the_engine_refuses_a_key_inside_base_url_unechoed():
    with pytest.raises(EngineError) as err:
        OpenAIChatModel(f"http://127.0.0.1:9/v1?api_key={KEY}", "m", api_key_env=None)
    assert KEY not in str(err.value) and "base_url" in str(err.value)


def test_endpoint_urls_without_keys_pass():
    from dynalize.backends.config import url_credential_problem

    for url in ["http://127.0.0.1:8000/v1", "https://x.openai.azure.com/openai/deployments/gpt-4o-2024-08-06?"
                "api-version=2024-02-15-preview", "http://node1:8000"]:
        assert url_credential_problem(url) is None, url
        assert ChatModelConfig(base_url=url).base_url == url


class EchoingServer(FaultServer):
    """Answers every request with `status` and a body quoting the request's Authorization header."""

    def __init__(self, status: int):
        self.status = status
        super().__init__(lambda body: "OK", lambda body: "echo")

    def respond(self, h, fault, body):
        send(h, self.status, json.dumps({"error": {"message": f"Invalid credentials in header "
                                                              f"'Authorization: {h.headers.get('Authorization')}'"}}))


@pytest.mark.parametrize("status", [401, 400])
@pytest.mark.parametrize("key", [KEY, OPAQUE])
def test_the_preflight_masks_an_authorization_header_an_endpoint_echoes(status, key, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", key)
    with EchoingServer(status) as server:
        line = one_error_line(toy(tmp_path, *judge(server.base_url, "JUDGE_KEY")), capsys, tmp_path)
    assert server.requests and f"HTTP {status}" in line
    assert key not in line and "Bearer ***" in line


def test_a_credential_the_request_did_not_send_is_masked_too():
    from dynalize.backends.secrets import mask_secrets

    body = ('{"error": "bad key for https://admin:hunter2pass@internal:8443/x?token=t0k3n&api_key=zz9 '
            'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc and ghp_0123456789abcdefghij0123"}')
    masked = mask_secrets(body)
    for secret in ["hunter2pass", "admin", "t0k3n", "zz9", "eyJhbGci", "ghp_0123"]:
        assert secret not in masked, (secret, masked)
    plain = "connect to http://127.0.0.1:8000/v1 failed: ConnectError: [Errno 111] Connection refused; max token limit"
    assert mask_secrets(plain) == plain
