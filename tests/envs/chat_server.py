"""A tiny OpenAI-compatible chat completions server for tests (aiohttp, 127.0.0.1, its own thread).

It answers `/v1/models` and `/v1/chat/completions` in the shapes the `openai` client parses, with
the reply `answer(messages)` returns, and keeps every request it received, so a test can check
what the model was shown. Not a gateway: just enough protocol to test a real client against.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from aiohttp import web

MODEL_NAME = "stub-model"


@contextmanager
def chat_server(answer: Callable[[list[dict]], str]) -> Iterator[tuple[str, list[dict]]]:
    """Yields (base URL without /v1, the list the received request bodies are appended to)."""
    requests: list[dict] = []

    async def models(request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "test"}]}
        )

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append(body)
        text = answer(body["messages"])
        return web.json_response(
            {
                "id": f"chatcmpl-{len(requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", completions)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", requests
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
