"""Engines are checked before the run directory exists and before any model loads: a setting that
cannot work (vLLM missing, a remote generator without servers) and, with `preflight` on, every
API-backed model that cannot be reached, refuses the key or does not serve the model, stop the run
with one line naming the role, the setting and the endpoint, exit 2. Real HTTP servers on 127.0.0.1."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import pytest

from dynalize.config import load_config
from dynalize.preflight import PING_TOKENS, PreflightError, chat_roles, ping_all, preflight, vllm_installed
from dynalize.run import main


class ModelServer:
    """An OpenAI-compatible server serving `models`, wanting `key` (None: any), recording requests."""

    def __init__(self, models=("judge",), key=None, status=None):
        self.models, self.key, self.status, self.requests = list(models), key, status, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def reply(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def refused(self) -> bool:
                """Answered with the server's fixed status, or a 401 for a wrong key."""
                if server.status:
                    self.reply(server.status, {"error": {"message": "overloaded"}})
                elif server.key and self.headers.get("authorization") != f"Bearer {server.key}":
                    self.reply(401, {"error": {"message": "invalid api key"}})
                else:
                    return False
                return True

            def do_GET(self):
                server.requests.append(("GET", self.path, None))
                if not self.refused():
                    self.reply(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in server.models]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                server.requests.append(("POST", self.path, body))
                if self.refused():
                    return
                if body["model"] not in server.models:
                    return self.reply(404, {"error": {"message": f"The model `{body['model']}` does not exist."}})
                self.reply(200, {"choices": [{"message": {"role": "assistant", "content": "OK"}}]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.root = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.base_url = self.root + "/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def toy(tmp_path, *extra):
    return [f"output_dir={tmp_path}", "name=run", "steps=2", "batch_size=8", "group_size=4", "progress=false",
            "generator.max_new_tokens=8", "task.name=toytask:ToyTask", "reward_model.engine=task",
            "checkpoint_every=0", "torch_threads=1", *extra]


def llm(role, url, model="judge", key_env=None):
    prefix = f"penalties.{role}"
    return ["penalties.enabled=true", f"{prefix}.engine=llm", f"{prefix}.chat.base_url={url}",
            f"{prefix}.chat.model={model}", f"{prefix}.chat.api_key_env={key_env or 'null'}"]


def refused(argv, capsys, tmp_path) -> str:
    """Run `argv`: exit 2, one line on stderr (returned), no run directory."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: "), err
    assert not any("Traceback" in line for line in err), err
    assert not (tmp_path / "run").exists()
    return err[-1]


ALL_ROLES = {
    "penalties.enabled": True, "rubric.enabled": True, "eval_every": 5,
    "penalties.proposer": {"engine": "llm", "chat": {"base_url": "URL", "model": "proposer"},
                           "dedup_chat": {"base_url": "URL", "model": "dedup"}},
    "penalties.judge": {"engine": "llm", "chat": {"base_url": "URL", "model": "penalty-judge"}},
    "rubric.judge": {"engine": "llm", "chat": {"base_url": "URL", "model": "proxy"}},
    "rubric.gold_judge": {"engine": "llm", "chat": {"base_url": "URL", "model": "gold"}},
    "task": {"name": "counseling_multiturn", "args": {"train_file": "examples/data/counseling_sample.jsonl",
                                                      "user_simulator": {"base_url": "URL", "model": "patient"}}},
}


def all_roles_config(url):
    overrides = [f"{k}={json.dumps(v).replace('URL', url)}" for k, v in ALL_ROLES.items()]
    return load_config(None, overrides)


def test_every_api_backed_model_a_run_uses_gets_one_short_request(tmp_path):
    with ModelServer(["proposer", "dedup", "penalty-judge", "proxy", "gold", "patient"]) as server:
        cfg = all_roles_config(server.base_url)
        assert [(r.role, r.setting) for r in chat_roles(cfg)] == [
            ("proposer", "penalties.proposer.chat"), ("dedup model", "penalties.proposer.dedup_chat"),
            ("penalty judge", "penalties.judge.chat"), ("rubric proxy judge", "rubric.judge.chat"),
            ("rubric gold judge", "rubric.gold_judge.chat"), ("the task's user simulator", "task.args.user_simulator")]
        preflight(cfg)
        no_eval = cfg.model_copy(update={"eval_every": 0})
        assert "rubric.gold_judge.chat" not in [r.setting for r in chat_roles(no_eval)]  # used only to evaluate
    asked = sorted(body["model"] for _, path, body in server.requests)
    assert asked == sorted(["proposer", "dedup", "penalty-judge", "proxy", "gold", "patient"])
    assert all(path == "/v1/chat/completions" and body["max_tokens"] == PING_TOKENS
               for _, path, body in server.requests)


def test_preflight_false_sends_nothing(tmp_path):
    with ModelServer([]) as server:
        cfg = all_roles_config(server.base_url).model_copy(update={"preflight": False})
        preflight(cfg)
    assert server.requests == []


def test_a_model_the_server_does_not_serve_is_named_with_its_role(tmp_path):
    with ModelServer(["proposer", "dedup", "penalty-judge", "proxy", "patient"]) as server:  # no "gold"
        with pytest.raises(PreflightError) as e:
            preflight(all_roles_config(server.base_url))
    assert str(e.value).startswith(f"preflight: rubric gold judge (rubric.gold_judge.chat) at {server.base_url}: "
                                   f"does not serve model 'gold': HTTP 404")


def test_an_unreachable_judge_stops_the_run_before_it_starts(tmp_path, capsys):
    url = closed_port() + "/v1"
    line = refused(toy(tmp_path, *llm("judge", url)), capsys, tmp_path)
    assert line.startswith(f"error: preflight: penalty judge (penalties.judge.chat) at {url}: cannot be reached (")
    assert line.endswith("set preflight: false to skip this check")


def test_a_refused_key_stops_the_run_naming_the_key_variable(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "wrong-key")
    with ModelServer(["proposer-model"], key="right-key") as server:
        line = refused(toy(tmp_path, *llm("proposer", server.base_url, "proposer-model", "JUDGE_KEY")),
                       capsys, tmp_path)
    assert f"proposer (penalties.proposer.chat) at {server.base_url}: refuses the key in $JUDGE_KEY: HTTP 401" in line
    assert "wrong-key" not in line


def test_a_server_answering_5xx_every_time_stops_the_run(tmp_path, capsys):
    with ModelServer(["judge"], status=503) as server:
        line = refused(toy(tmp_path, *llm("judge", server.base_url)), capsys, tmp_path)
    assert "answers HTTP 503" in line and len(server.requests) == 3  # tried three times


# --- the remote generator --------------------------------------------------------------------------

def test_remote_generator_without_base_urls_is_one_line(tmp_path, capsys):
    line = refused(toy(tmp_path, "generator.engine=remote"), capsys, tmp_path)
    assert line.startswith("error: config error: generator.engine is remote, but generator.base_urls is empty")


def test_an_unreachable_remote_generator_is_one_line_naming_the_server(tmp_path, capsys):
    url = closed_port()
    line = refused(toy(tmp_path, "generator.engine=remote", f"generator.base_urls=[{url}]"), capsys, tmp_path)
    assert line.startswith(f"error: preflight: the remote generator (generator.base_urls) at {url}: cannot be reached")


def test_a_remote_server_that_serves_another_model_is_one_line(tmp_path, capsys):
    with ModelServer(["other"]) as server:
        line = refused(toy(tmp_path, "generator.engine=remote", f"generator.base_urls=[{server.root}]",
                           "generator.served_model_name=policy"), capsys, tmp_path)
    assert (f"at {server.root}: does not serve model 'policy' (it serves 'other'; "
            f"set generator.served_model_name)") in line
    assert server.requests == [("GET", "/v1/models", None)]


# --- vLLM not installed ----------------------------------------------------------------------------

needs_no_vllm = pytest.mark.skipif(vllm_installed(), reason="vLLM is installed here")


@needs_no_vllm
def test_the_vllm_generator_without_vllm_is_one_line(tmp_path, capsys):
    line = refused(toy(tmp_path, "generator.engine=vllm"), capsys, tmp_path)
    assert line.startswith("error: config error: generator.engine is vllm, but vLLM is not installed: "
                           "`pip install vllm`")


@needs_no_vllm
def test_a_judge_on_vllm_without_vllm_is_one_line(tmp_path, capsys):
    line = refused(toy(tmp_path, "penalties.enabled=true", "penalties.judge.engine=llm",
                       "penalties.judge.chat.engine=vllm", "penalties.judge.chat.path=tiny:chat"), capsys, tmp_path)
    assert line.startswith("error: config error: penalties.judge.chat.engine is vllm (penalty judge), but vLLM is "
                           "not installed")


def test_the_preflight_timeout_is_a_deadline_for_the_whole_request_not_per_read(tmp_path):
    """A server trickling its answer a byte at a time (40 s for about 70 bytes: each byte well inside
    the timeout) is cut at the chat model's `timeout`: one line naming the deadline. The test's own
    bound is generous; a per-read timeout passed the preflight after the whole trickle."""
    from faultserver import FaultServer

    with FaultServer(lambda body: "OK", lambda body: "trickle", trickle_s=40) as server:
        cfg = load_config(None, [*toy(tmp_path, *llm("judge", server.base_url))[1:],
                                 "penalties.judge.chat.timeout=1", "penalties.judge.chat.max_retries=0"])

        async def bounded():
            with anyio.fail_after(60):  # a per-read timeout would hold the preflight for the whole trickle
                await ping_all(cfg)

        with pytest.raises(PreflightError) as e:
            anyio.run(bounded)
    line = str(e.value)
    assert "\n" not in line and "gives no complete answer within the deadline of 1s (timeout)" in line
    assert len(server.requests) == 1  # max_retries: 0 — one try
