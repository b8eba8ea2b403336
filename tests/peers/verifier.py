"""A charge API behind a peer verifier, for tests/interop.rs.

    python verifier.py idemkit default|stripe
    python verifier.py fastapi-idempotency

Serves on 127.0.0.1 on a free port and prints "PORT <n>" first:
- POST /v1/charges {"amount": n, "hold": bool}: counts an execution, waits while "hold"
  is set until GET /release, answers 200 {"id": "ch_<k>", "object": "charge", "amount": n};
- GET /stats: {"executions": k};
- GET /release: lets held charges answer.
Only the POST is behind the verifier (both apply to writes only).
"""

import asyncio
import socket
import sys

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

peer = sys.argv[1]
app = FastAPI()
state = {"executions": 0}
released = asyncio.Event()


@app.post("/v1/charges")
async def charge(request: Request):
    body = await request.json()
    state["executions"] += 1
    n = state["executions"]
    if body.get("hold"):
        await released.wait()
    return JSONResponse({"id": f"ch_{n}", "object": "charge", "amount": body.get("amount")})


@app.get("/stats")
async def stats():
    return {"executions": state["executions"]}


@app.get("/release")
async def release():
    released.set()
    return {"released": True}


if peer == "idemkit":
    from idemkit import HttpConfig, IdempotencyMiddleware, InMemoryBackend

    config = HttpConfig(
        compat_mode=sys.argv[2],
        scope_mode="single_tenant",
        # A duplicate of a held request waits this long, then gets 423 (409 in stripe mode).
        wait_timeout_seconds=0.3,
        lease_ttl_seconds=5.0,
    )
    app.add_middleware(IdempotencyMiddleware, backend=InMemoryBackend(), config=config)
elif peer == "fastapi-idempotency":
    from fastapi_idempotency import IdempotencyMiddleware, MemoryStore

    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), wait_seconds=0.3)
else:
    sys.exit(f"unknown peer {peer!r}: idemkit or fastapi-idempotency")

sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
sock.listen(128)
print(f"PORT {sock.getsockname()[1]}", flush=True)
uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
