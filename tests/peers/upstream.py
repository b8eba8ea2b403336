# A plain charge API with no idempotency of its own, for the `idemkey proxy` tests: it
# counts executions so a test can tell how often a charge ran behind the proxy.
#
#     python3 upstream.py [PORT]   prints "PORT <n>", then serves on 127.0.0.1:<n>
#                                  (a free port unless PORT is given)
#
# POST /v1/charges (form or JSON: amount, optional delay_ms) answers
# {"id": "ch_<n>", "object": "charge", "amount": ...}; GET /stats answers
# {"executions": n}.
import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
executions = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, payload):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/stats":
            with lock:
                self.answer(200, {"executions": executions})
        else:
            self.answer(404, {"error": "not found"})

    def do_POST(self):
        global executions
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode()
        if (self.headers.get("Content-Type") or "").startswith("application/json"):
            fields = json.loads(raw or "{}")
        else:
            fields = {k: v[0] for k, v in urllib.parse.parse_qs(raw).items()}
        if self.path != "/v1/charges":
            self.answer(404, {"error": "not found"})
            return
        delay = int(fields.get("delay_ms") or 0)
        if delay:
            time.sleep(delay / 1000)
        with lock:
            executions += 1
            n = executions
        self.answer(200, {"id": f"ch_{n}", "object": "charge", "amount": int(fields.get("amount") or 0)})


port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
print(f"PORT {server.server_address[1]}", flush=True)
server.serve_forever()
