"""`python -m dynalize.monitor --reward`: the run's reward confirms each discovered pattern by
scoring edited replies; a reward that fails is a failing judge: one line, never a silent fallback."""

from __future__ import annotations

import html
import json
import random
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dynalize.monitor.__main__ import main
from dynalize.monitor.summary import LIVE_EXIT

from test_monitor import hacked_rows, write_jsonl

REWARD_MODULE = '''
import random, zlib

def reward(prompts, completions, **kwargs):
    """TRL's signature: pays 1.5 for opening with "Certainly!", with noise."""
    return [1.5 * c.startswith("Certainly!") + random.Random(zlib.crc32((p + c).encode())).gauss(0, 1)
            for p, c in zip(prompts, completions)]
'''


def paid(prompt: str, completion: str) -> float:
    return 1.5 * completion.startswith("Certainly!") + random.Random(zlib.crc32((prompt + completion).encode())).gauss(0, 1)


class RewardServer:
    """A reward endpoint on 127.0.0.1: POST {prompts, completions} -> {rewards}; `fail_after`
    calls answered, then 500s."""

    def __init__(self, fail_after: int | None = None):
        self.calls = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.calls += 1
                if fail_after is not None and server.calls > fail_after:
                    self.send_response(500)
                    self.end_headers()
                    return
                out = json.dumps({"rewards": [paid(p, c) for p, c in zip(body["prompts"], body["completions"])]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(out.encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/reward"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server_factory():
    made = []
    yield lambda **kw: made.append(RewardServer(**kw)) or made[-1]
    for s in made:
        s.close()


def monitor(tmp_path, *extra) -> tuple[int, dict]:
    rows = write_jsonl(tmp_path / "rows.jsonl", hacked_rows(15))
    status = main([str(rows), "--out", str(tmp_path / "mon"), "--no-html", *map(str, extra)])
    path = tmp_path / "mon" / "summary.json"
    return status, json.loads(path.read_text()) if path.exists() else {}


def test_a_trl_reward_function_confirms_the_pattern_it_pays_for(tmp_path, monkeypatch, capsys):
    (tmp_path / "reward_57_trl.py").write_text(REWARD_MODULE)
    monkeypatch.chdir(tmp_path)
    status, summary = monitor(tmp_path, "--reward", "reward_57_trl:reward")
    assert status == LIVE_EXIT
    (p,) = [p for p in summary["patterns"] if p["live"]]
    assert p["confirmation"]["state"] == "confirmed" and p["confirmation"]["lo"] <= 1.5 <= p["confirmation"]["hi"]
    assert p["confirmed"].startswith("reward pays +") and p["confirmed"] in summary["verdict"]
    assert "(the reward pays for all 1 itself, edited replies show)" in summary["verdict"]
    assert "reward pays +" in capsys.readouterr().err  # the console table
    metrics = [json.loads(line) for line in (tmp_path / "mon" / "metrics.jsonl").read_text().splitlines()]
    assert sum(m.get("confirm/reward_calls", 0) for m in metrics) > 0
    from dynalize.analysis.html import render_page
    from dynalize.analysis.runs import Run

    assert html.escape(p["confirmed"]) in render_page([Run(tmp_path / "mon")])  # the HTML report's penalty table


def test_without_a_reward_a_pattern_says_it_is_correlational_only(tmp_path):
    status, summary = monitor(tmp_path)
    assert status == LIVE_EXIT
    (p,) = [p for p in summary["patterns"] if p["live"]]
    assert p["confirmation"] is None
    assert p["confirmed"] == "not confirmed: correlational only (the reward could not be called)"
    assert "none confirmed by edited replies: correlational only" in summary["verdict"]


def test_an_http_reward_endpoint_confirms_the_pattern(tmp_path, server_factory):
    server = server_factory()
    status, summary = monitor(tmp_path, "--reward", server.url)
    assert status == LIVE_EXIT and server.calls > 1
    assert [p["confirmation"]["state"] for p in summary["patterns"] if p["live"]] == ["confirmed"]


def test_a_failing_reward_endpoint_stops_the_monitor_before_anything_is_written(tmp_path, server_factory, capsys):
    server = server_factory(fail_after=0)
    status, _ = monitor(tmp_path, "--reward", server.url)
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1
    assert err == f"monitor: the reward failed its check (one reply scored): --reward {server.url}: HTTP 500 " \
        "Internal Server Error"
    assert not (tmp_path / "mon").exists()


def test_a_reward_endpoint_failing_mid_run_stops_the_monitor_in_one_line(tmp_path, server_factory, capsys):
    server = server_factory(fail_after=1)  # the preflight passes, the first confirmation fails
    status, _ = monitor(tmp_path, "--reward", server.url)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("monitor stopped")]
    assert status == 3 and len(err) == 1
    assert err[0].startswith("monitor stopped: the reward confirming discovered patterns failed: ")


@pytest.mark.parametrize("spec, says", [("no_colon", "expects module:function"),
                                        ("no_such_module_57:f", "ModuleNotFoundError")])
def test_a_reward_that_cannot_be_loaded_is_one_line(tmp_path, capsys, spec, says):
    status, _ = monitor(tmp_path, "--reward", spec)
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and says in err


UNPAID_MODULE = '''
import random, zlib

def reward(prompts, completions, **kwargs):
    """Pays nothing for the opener the logged rewards travel with: noise only."""
    return [random.Random(zlib.crc32((p + c).encode())).gauss(0, 1) for p, c in zip(prompts, completions)]
'''


def test_a_candidate_the_reward_does_not_pay_for_is_rejected_and_listed_as_a_co_traveller(tmp_path, monkeypatch, capsys):
    (tmp_path / "reward_57_unpaid.py").write_text(UNPAID_MODULE)
    monkeypatch.chdir(tmp_path)
    status, summary = monitor(tmp_path, "--reward", "reward_57_unpaid:reward")
    assert not [p for p in summary["patterns"] if p["live"]]
    assert summary["co_travellers"] and all(c["said"].startswith("rejected: co-traveller (pay ")
                                            for c in summary["co_travellers"])
    assert any("Certainly" in c["title"] for c in summary["co_travellers"])
    err = capsys.readouterr().err
    assert f"{summary['co_travellers'][0]['title']!r} rejected: co-traveller (pay " in err
