"""`rollhub serve` against a web page, a slow client and a hostile weight folder.

A browser page can reach a loopback server: a cross-site `text/plain` POST needs no CORS
preflight, and DNS rebinding makes the page's own host name point at 127.0.0.1. A client
can send a huge `text`, hold sockets open with half a request, nest JSON deeply, or point
`/update_weights_from_disk` at a folder with wrong shapes or NaNs. Every case must be
refused before it changes the engine, and other clients must keep being served.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from aiohttp import web

from rollhub.inference.engines.hf import HFEngine
from rollhub.inference.server import build_app

KEY = "attack-test-key-0b7d"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {**AUTH, "Content-Type": "application/json"}


async def _start(app: web.Application) -> tuple[web.AppRunner, str, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}", port


@pytest.fixture
async def served(tiny_model_and_tokenizer):
    """The shared tiny model behind a keyed server (tests here never change its weights)."""
    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer, threads=1, max_batch_size=32)
    runner, url, port = await _start(build_app(engine, api_key=KEY))
    yield engine, url, port
    await runner.cleanup()


@pytest.fixture
async def own_model_served(tiny_model_dir):
    """A fresh copy of the tiny model: weight updates change it."""
    from rollhub.inference.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    engine = HFEngine(model, tokenizer, threads=1)
    runner, url, _ = await _start(build_app(engine, api_key=KEY))
    yield engine, url
    await runner.cleanup()


async def raw_request(port: int, data: bytes, timeout_s: float = 30.0) -> tuple[int, bytes]:
    """One raw HTTP/1.1 exchange (for headers aiohttp's client will not send as written)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await asyncio.wait_for(reader.readexactly(length), timeout_s) if length else b""
        return status, body
    finally:
        writer.close()


def http_post(path: str, body: bytes, headers: dict[str, str], host: str = "127.0.0.1") -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items())]
    if "Transfer-Encoding" not in headers:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(body: bytes, size: int = 7) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


# --- cross-site requests: Content-Type, Origin, Host ------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
        "application/json-patch+json",
        "text/json",
        None,
    ],
)
async def test_a_post_that_is_not_declared_json_is_refused_and_does_not_pause(served, content_type):
    """What a web page can send cross-site without a preflight (or with no type at all)."""
    engine, url, _ = served
    headers = {**AUTH, **({"Content-Type": content_type} if content_type else {})}
    async with aiohttp.ClientSession(skip_auto_headers=["Content-Type"]) as http:
        async with http.post(url + "/pause_generation", data=b'{"mode": "abort"}', headers=headers) as r:
            assert r.status == 415, await r.text()
            assert "application/json" in (await r.json())["error"]["message"]
        media = (content_type or "").split(";")[0]
        if media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):  # no preflight
            async with http.post(url + "/pause_generation", data=b"", headers=headers) as r:
                assert r.status == 415  # also without a body
    assert not engine.paused


async def test_a_post_without_a_body_needs_no_content_type(served):
    """SGLang's `curl -X POST .../flush_cache` keeps working."""
    _, url, port = served
    async with aiohttp.ClientSession(skip_auto_headers=["Content-Type"]) as http:
        async with http.post(url + "/flush_cache", headers=AUTH) as r:
            assert r.status == 200
    status, _ = await raw_request(port, http_post("/flush_cache", b"", AUTH))
    assert status == 200
    status, _ = await raw_request(
        port, http_post("/flush_cache", b"0\r\n\r\n", {**AUTH, "Transfer-Encoding": "chunked"})
    )
    assert status == 415  # a body of unknown length must say what it is


@pytest.mark.parametrize("transfer", ["length", "chunked"])
@pytest.mark.parametrize(
    "content_types, allowed",
    [
        (["application/json"], True),
        (["Application/JSON; charset=utf-8"], True),
        (["text/plain"], False),
        (["application/json", "text/plain"], False),  # duplicates: which one a proxy reads is unknown
        (["text/plain", "application/json"], False),
    ],
)
async def test_content_type_is_read_strictly_also_for_chunked_bodies(served, transfer, content_types, allowed):
    engine, _, port = served
    body = b'{"new_version": "5"}'
    headers = {**AUTH, **({"Transfer-Encoding": "chunked"} if transfer == "chunked" else {})}
    head = http_post("/update_weight_version", b"", headers).removesuffix(b"\r\n\r\n")
    if transfer == "length":
        head = head.replace(b"Content-Length: 0", f"Content-Length: {len(body)}".encode())
    extra = "".join(f"\r\nContent-Type: {t}" for t in content_types).encode()
    payload = head + extra + b"\r\n\r\n" + (chunked(body) if transfer == "chunked" else body)
    status, reply = await raw_request(port, payload)
    if allowed:
        assert status == 200, reply
    else:  # aiohttp's parser refuses a duplicated Content-Type itself (400)
        assert status == (415 if len(content_types) == 1 else 400), reply
    assert engine.weight_version == (5 if allowed else 0)


@pytest.mark.parametrize(
    "origin",
    ["http://evil.example", "null", "NULL", "http://127.0.0.1", "https://localhost", "file://", "HTTP://EVIL.EXAMPLE"],
)
async def test_a_browser_origin_is_refused_unless_allowed(served, origin):
    engine, url, port = served
    async with aiohttp.ClientSession() as http:
        for method, path, body in (("POST", "/pause_generation", {}), ("GET", "/get_model_info", None)):
            headers = {**AUTH, "Origin": origin.replace("127.0.0.1", f"127.0.0.1:{port}")}
            async with http.request(method, url + path, json=body, headers=headers) as r:
                assert r.status == 403, (origin, path, await r.text())
                assert "Origin" in (await r.json())["error"]["message"]
        # what an <img> or a navigation from another site carries: no Origin, a Sec-Fetch-Site
        for site in ("cross-site", "same-site", "Cross-Site"):
            async with http.get(url + "/flush_cache", headers={**AUTH, "Sec-Fetch-Site": site}) as r:
                assert r.status == 403, site
    assert not engine.paused


async def test_an_allowed_origin_passes_and_look_alikes_do_not(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer, threads=1)
    app = build_app(engine, api_key=KEY, allowed_origins=["http://ui.example:8080"])
    runner, url, _ = await _start(app)
    try:
        async with aiohttp.ClientSession() as http:
            for origin, status in (
                ("http://ui.example:8080", 200),
                ("HTTP://UI.EXAMPLE:8080", 200),
                ("http://ui.example:8080.evil.example", 403),
                ("http://ui.example", 403),
                ("https://ui.example:8080", 403),
                ("null", 403),
            ):
                async with http.get(url + "/get_weight_version", headers={**AUTH, "Origin": origin}) as r:
                    assert r.status == status, origin
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:{port}",
        "localhost.evil.example:{port}",
        "127.0.0.1.nip.io:{port}",
        "0x7f000001:{port}",
        "127.1:{port}",
        "EVIL.example.:{port}",
        "",
    ],
)
async def test_dns_rebinding_a_foreign_host_name_is_refused(served, host):
    """A page whose name was re-pointed at 127.0.0.1 still sends its own name as Host."""
    engine, _, port = served
    for path in ("/pause_generation", "/health"):
        request = http_post(path, b"{}", {**JSON}, host=host.format(port=port))
        status, reply = await raw_request(port, request)
        assert status in (400, 403), (host, path, reply)
    assert not engine.paused


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "localhost.", "[::1]:{port}", "10.2.3.4"]
)
async def test_ip_literals_and_localhost_are_served(served, host):
    _, _, port = served
    request = http_post("/update_weight_version", b'{"new_version": "1"}', JSON, host=host.format(port=port))
    status, reply = await raw_request(port, request)
    assert status == 200, (host, reply)


async def test_two_host_headers_are_refused(served):
    _, _, port = served
    request = http_post("/pause_generation", b"{}", JSON).replace(
        b"Host: 127.0.0.1", b"Host: 127.0.0.1\r\nHost: evil.example"
    )
    status, _ = await raw_request(port, request)
    assert status in (400, 403)


async def test_a_configured_host_name_is_served(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer, threads=1)
    runner, _, port = await _start(build_app(engine, api_key=KEY, allowed_hosts=["gpu-node-3"]))
    try:
        for host, status in (("GPU-node-3:30000", 200), ("gpu-node-3.evil.example", 403), ("gpu-node-4", 403)):
            request = http_post("/update_weight_version", b'{"new_version": "2"}', JSON, host=host)
            assert (await raw_request(port, request))[0] == status, host
    finally:
        await runner.cleanup()


# --- body size, long text, tokenisation off the event loop -------------------------------------


async def test_an_oversized_body_gets_413_whether_announced_or_chunked(served):
    engine, url, port = served
    big = json.dumps({"input_ids": [1] * 3_000_000, "sampling_params": {"max_new_tokens": 0}}).encode()
    assert len(big) > 8 << 20
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/generate", data=big, headers=JSON) as r:
            assert r.status == 413
    status, _ = await raw_request(
        port, http_post("/generate", chunked(big, 1 << 16), {**JSON, "Transfer-Encoding": "chunked"})
    )
    assert status == 413
    async with aiohttp.ClientSession() as http:  # still serving
        async with http.post(
            url + "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}, headers=AUTH
        ) as r:
            assert r.status == 200


async def test_text_longer_than_the_context_is_refused_before_tokenising(served, monkeypatch):
    engine, url, _ = served
    calls = []
    original = engine.tokenizer.encode
    monkeypatch.setattr(engine.tokenizer, "encode", lambda *a, **k: calls.append(1) or original(*a, **k))
    too_long = "word " * (engine.max_positions * 40 // 5)
    async with aiohttp.ClientSession() as http:
        for text in (too_long, ["short", too_long]):
            async with http.post(url + "/generate", json={"text": text}, headers=AUTH) as r:
                assert r.status == 400
                assert "context" in (await r.json())["error"]["message"]
        assert not calls  # refused on its length alone
        # short enough in characters, too many tokens: refused after tokenising (not a silent empty answer)
        dense = "\u4e00\u4e8c\u4e09" * engine.max_positions
        async with http.post(url + "/generate", json={"text": dense}, headers=AUTH) as r:
            assert r.status == 400
            assert "context" in (await r.json())["error"]["message"]


async def test_tokenising_a_big_batch_does_not_stall_other_clients(served):
    """/health is answered while a batch of long texts is tokenised (before: the event loop
    tokenised, and every client waited for it). Probed from a thread: the client must not
    share the server's event loop, or it would stall with it."""
    import threading
    import urllib.request

    engine, url, _ = served
    piece = "the quick brown fox jumps over 13 lazy dogs; " * 40  # ~1,800 chars, under the context in tokens
    body = json.dumps({"text": [piece + str(i) for i in range(1200)], "sampling_params": {"max_new_tokens": 0}})

    def health() -> float:
        started = time.perf_counter()
        with urllib.request.urlopen(url + "/health", timeout=60) as response:
            assert response.status == 200
        return time.perf_counter() - started

    baseline = statistics.median([await asyncio.to_thread(health) for _ in range(10)])
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            latencies.append(health())
            time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    started = time.perf_counter()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/generate", data=body.encode(), headers=JSON) as r:
                assert r.status == 200, await r.text()
                assert len(await r.json()) == 1200
    finally:
        took = time.perf_counter() - started
        done.set()
        await asyncio.to_thread(prober.join)
    assert took > 0.5, "the batch must take long enough to measure a stall"
    assert max(latencies) < max(0.3, 20 * baseline, took / 5), (max(latencies), baseline, took)
    assert len(latencies) >= 3


# --- slow clients: header and body read timeouts ------------------------------------------------


async def test_idle_and_partial_requests_are_closed_and_new_clients_get_in(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    engine = HFEngine(model, tokenizer, threads=1)
    app = build_app(engine, api_key=KEY, header_timeout_s=0.5, body_timeout_s=0.5)
    runner, url, port = await _start(app)
    sockets = []
    try:
        for index in range(200):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if index % 4 == 0:
                pass  # connects and says nothing
            elif index % 4 == 1:
                writer.write(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")  # half a header
            elif index % 4 == 2:  # whole header, a trickle of body
                writer.write(
                    http_post("/generate", b'{"input_ids": [1', {**JSON}).replace(
                        b"Content-Length: 16", b"Content-Length: 900"
                    )
                )
            else:  # chunked, never finished
                writer.write(http_post("/generate", b'5\r\n{"inp', {**JSON, "Transfer-Encoding": "chunked"}))
            await writer.drain()
            sockets.append((reader, writer))
        started = time.perf_counter()
        still_open = []
        for index, (reader, _) in enumerate(sockets):
            try:
                await asyncio.wait_for(reader.read(), timeout=max(0.1, 8 - (time.perf_counter() - started)))
            except (TimeoutError, ConnectionError):
                still_open.append(index % 4)
        assert not still_open, f"{len(still_open)} slow connections still open after 8 s, kinds {set(still_open)}"
        async with aiohttp.ClientSession() as http:
            body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
            async with http.post(url + "/generate", json=body, headers=AUTH) as r:
                assert r.status == 200
    finally:
        for _, writer in sockets:
            writer.close()
        await runner.cleanup()


# --- parsing: deep JSON, versions ---------------------------------------------------------------


@pytest.mark.parametrize(
    "path, text",
    [
        ("/generate", "[" * 100_000 + "]" * 100_000),
        ("/generate", '{"input_ids": ' + "[" * 50_000 + "1" + "]" * 50_000 + "}"),
        ("/generate", '{"text": "a", "sampling_params": ' + '{"a": ' * 20_000 + "1" + "}" * 20_001),
        ("/pause_generation", '{"mode": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        ("/update_weight_version", "[" * 100_000),
        ("/update_weights_from_disk", '{"model_path": ' + "{" * 3000),
    ],
)
async def test_deeply_nested_json_is_a_400_not_a_500(served, path, text):
    engine, url, _ = served
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, data=text.encode(), headers=JSON) as r:
            assert r.status == 400, await r.text()
    assert not engine.paused and engine.weight_version == 0


@pytest.mark.parametrize(
    "version",
    [
        "\u0663",
        "\u00b2",
        "\uff17",
        "\u0967\u0968",
        "1\u0663",
        "+3",
        " 3",
        "3 ",
        "0x3",
        "1_000",
        "3.0",
        "9" * 5000,
        str(1 << 64),
        1 << 64,
    ],
)
async def test_versions_are_ascii_digits_only(served, version):
    engine, url, _ = served
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/update_weight_version", json={"new_version": version}, headers=AUTH) as r:
            assert r.status == 400, (version, await r.text())
        async with http.post(
            url + "/update_weights_from_disk",
            json={"model_path": "/nonexistent", "weight_version": version},
            headers=AUTH,
        ) as r:
            assert r.status == 400
    assert engine.weight_version == 0


# --- disk weight updates: validated like the collective path, all or nothing --------------------


def _write_checkpoint(folder: Path, files: dict[str, dict[str, torch.Tensor]]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    for name, tensors in files.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / name))
    return folder


async def _disk_update(url: str, folder: Path, version: int = 7) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        body = {"model_path": str(folder), "weight_version": str(version)}
        async with http.post(url + "/update_weights_from_disk", json=body, headers=AUTH) as r:
            return r.status, await r.json()


def _hostile_checkpoints(state: dict[str, torch.Tensor]) -> dict[str, dict[str, dict[str, torch.Tensor]]]:
    names = sorted(state)
    first, second = names[0], names[1]
    vector = next(n for n in names if state[n].dim() == 1)
    matrix = next(n for n in names if state[n].dim() == 2)
    good_first = state[first] + 0.5
    nan = state[matrix].clone()
    nan[0, 0] = float("nan")
    inf = state[vector].clone()
    inf[-1] = float("inf")
    return {
        # one row that torch would broadcast over the whole matrix
        "broadcastable_row": {"a.safetensors": {matrix: state[matrix][:1].clone()}},
        "scalar_for_vector": {"a.safetensors": {vector: torch.ones(1)}},
        "transposed": {"a.safetensors": {matrix: state[matrix].t().contiguous()}},
        "extra_dim": {"a.safetensors": {vector: state[vector].unsqueeze(0)}},
        # a good tensor first, then a bad one: the first must not stay applied
        "good_then_wrong_shape": {"a.safetensors": {first: good_first, second: torch.zeros(3)}},
        "good_then_unknown_name": {"a.safetensors": {first: good_first, "model.backdoor.weight": torch.zeros(2)}},
        "good_then_nan": {"a.safetensors": {first: good_first, matrix: nan}},
        "inf": {"a.safetensors": {vector: inf}},
        "integer_dtype": {"a.safetensors": {vector: torch.zeros_like(state[vector], dtype=torch.int32)}},
        "float64": {"a.safetensors": {vector: state[vector].double()}},
        "same_name_in_two_files": {"a.safetensors": {first: good_first}, "b.safetensors": {first: state[first] - 1}},
        "no_tensors_at_all": {},
    }


async def test_hostile_disk_updates_are_refused_and_leave_weights_and_version_untouched(own_model_served, tmp_path):
    engine, url = own_model_served
    before = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    for case, files in _hostile_checkpoints(before).items():
        status, reply = await _disk_update(url, _write_checkpoint(tmp_path / case, files))
        assert status == 400 and reply["success"] is False, (case, reply)
        assert engine.weight_version == 0, case
        after = engine.model.state_dict()
        changed = [name for name in before if not torch.equal(before[name], after[name])]
        assert not changed, (case, changed[:3])
    # a good partial update still works, and takes the version
    name = sorted(before)[0]
    status, reply = await _disk_update(
        url, _write_checkpoint(tmp_path / "good", {"a.safetensors": {name: before[name] + 0.25}}), 9
    )
    assert status == 200 and reply["success"], reply
    assert engine.weight_version == 9
    assert torch.allclose(engine.model.state_dict()[name], before[name] + 0.25)


async def test_an_in_process_update_is_all_or_nothing(tiny_model_dir):
    """HFEngine.update_weights itself (the trainer's same-process path): every shape is checked
    before the first copy, so a broadcastable row is refused and nothing before it stays applied."""
    from rollhub.inference.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    engine = HFEngine(model, tokenizer, threads=1)
    try:
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        names = sorted(before)
        matrix = next(n for n in names[1:] if before[n].dim() == 2)
        update = {names[0]: before[names[0]] + 1.0, matrix: before[matrix][:1] + 1.0}  # the row would broadcast
        with pytest.raises(ValueError, match="nothing was loaded"):
            await engine.update_weights(update, 5)
        assert engine.weight_version == 0
        assert all(torch.equal(before[n], model.state_dict()[n]) for n in before)
    finally:
        await engine.close()


async def test_a_distributed_update_with_nan_weights_is_refused_after_receiving(own_model_served):
    """The collective path checks values too: NaN arrives in full, then is refused whole."""
    from rollhub.inference.engines.sglang import SGLangEngine
    from rollhub.inference.weight_sync import DistributedWeightSync, WeightSyncError

    engine, url = own_model_served
    client = SGLangEngine(url, api_key=KEY)
    sync = DistributedWeightSync(backend="gloo", timeout_s=60)
    before = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    poisoned = {k: v + 0.125 for k, v in before.items()}
    matrix = next(n for n in sorted(poisoned) if poisoned[n].dim() == 2)
    poisoned[matrix][1, 2] = float("nan")
    try:
        with pytest.raises(WeightSyncError, match="NaN"):
            await sync.push([client], poisoned, 3)
        assert engine.weight_version == 0
        after = engine.model.state_dict()
        assert all(torch.equal(before[n], after[n]) for n in before)
        good = {k: v + 0.25 for k, v in before.items()}
        await sync.push([client], good, 4)
        assert engine.weight_version == 4 and torch.equal(engine.model.state_dict()[matrix], good[matrix])
    finally:
        await sync.close([client])
        await client.close()


# --- no key by default ----------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # a fresh Python + transformers import: ~10-40 s on 2 shared cores
async def test_rollhub_serve_without_a_key_generates_one_and_never_logs_it(tiny_model_dir, tmp_path):
    import subprocess
    import urllib.error
    import urllib.request

    port = _free_port()
    key_file = tmp_path / "keys" / "serve.key"
    env = {k: v for k, v in os.environ.items() if k != "ROLLHUB_API_KEY"} | {"OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "rollhub.cli", "serve", "--model", str(tiny_model_dir), "--port", str(port)]
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*command, "--api-key-file", str(key_file)], stdout=log, stderr=subprocess.STDOUT, env=env
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, log_path.read_text()[-2000:]
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()[-2000:]
            time.sleep(0.25)
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/get_weight_version") as r:
                assert r.status == 401
            async with http.post(url + "/pause_generation", json={}) as r:
                assert r.status == 401
            key = key_file.read_text().strip()
            assert len(key) >= 32
            assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
            async with http.get(url + "/get_weight_version", headers={"Authorization": f"Bearer {key}"}) as r:
                assert r.status == 200
    finally:
        process.terminate()
        process.wait(timeout=30)
    log = log_path.read_text()
    assert key not in log and str(key_file) in log


def test_serve_keys_explicit_file_environment_generated_and_no_auth(tmp_path, monkeypatch):
    from rollhub.core.errors import UserError
    from rollhub.inference.server import serve_key

    monkeypatch.delenv("ROLLHUB_API_KEY", raising=False)
    generated = serve_key(None, key_file=tmp_path / "k1", no_auth=False, host="127.0.0.1")
    assert len(generated.key) >= 32 and (tmp_path / "k1").read_text().strip() == generated.key
    assert stat.S_IMODE((tmp_path / "k1").stat().st_mode) == 0o600
    again = serve_key(None, key_file=tmp_path / "k1", no_auth=False, host="127.0.0.1")
    assert again.key == generated.key  # an existing key file is read, not replaced
    assert serve_key("given-key-123", key_file=None, no_auth=False, host="0.0.0.0").key == "given-key-123"
    monkeypatch.setenv("ROLLHUB_API_KEY", "from-env-456")
    assert serve_key(None, key_file=None, no_auth=False, host="0.0.0.0").key == "from-env-456"
    assert serve_key(None, key_file=tmp_path / "absent", no_auth=False, host="::1").key == "from-env-456"
    assert not (tmp_path / "absent").exists()
    assert serve_key(None, key_file=tmp_path / "k1", no_auth=False, host="::1").key == generated.key  # file first
    monkeypatch.delenv("ROLLHUB_API_KEY")
    assert serve_key(None, key_file=None, no_auth=True, host="127.0.0.1").key is None
    for host in ("0.0.0.0", "10.0.0.5", "::", "my-host"):
        with pytest.raises(UserError, match="loopback"):
            serve_key(None, key_file=None, no_auth=True, host=host)
    with pytest.raises(UserError):
        serve_key("k", key_file=None, no_auth=True, host="127.0.0.1")
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "empty").chmod(0o600)
    (tmp_path / "shared").write_text("a-key-others-can-read\n")
    (tmp_path / "shared").chmod(0o644)
    (tmp_path / "link").symlink_to(tmp_path / "k1")
    for bad in ("empty", "shared", "link"):
        with pytest.raises(UserError):
            serve_key(None, key_file=tmp_path / bad, no_auth=False, host="127.0.0.1")
    # the default file is per launch: a second launch replaces the first one's key
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    first = serve_key(None, key_file=None, no_auth=False, host="127.0.0.1", port=31234)
    second = serve_key(None, key_file=None, no_auth=False, host="127.0.0.1", port=31234)
    assert first.file == second.file == tmp_path / "run" / "rollhub" / "serve-31234.key"
    assert first.key != second.key and second.file.read_text().strip() == second.key
    assert stat.S_IMODE(second.file.parent.stat().st_mode) == 0o700
