"""TEST SCAFFOLDING: a minimal prefill/decode router for AIBrixPDReuseConnector.

What a PD router (AIBrix's gateway, vLLM's disaggregated proxies) does with
each completion request, and nothing more:

1. send it to the prefiller with `kv_transfer_params: {"do_remote_decode":
   true}`, `max_tokens: 1` and no streaming: the prefiller computes the
   prompt, its connector writes the prompt's KV to the L2 (EIC), and the
   response carries the `kv_transfer_params` for the decoder;
2. send the original request to the decoder with those `kv_transfer_params`
   (`do_remote_prefill: true`): the decoder loads the prompt's KV from the
   L2 and decodes. Its response (streamed when the client asked for a
   stream) is the client's.

Serves POST /v1/completions and GET /health on 127.0.0.1 in a thread of the
calling process; stdlib only. Each request's prefill step is kept in
`history` (the prefiller's response id and transfer parameters) for tests.
"""

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TIMEOUT_S = 300.0


class PrefillStep:
    def __init__(self, prefill_id: str, kv_transfer_params: dict | None) -> None:
        self.prefill_id = prefill_id
        self.kv_transfer_params = kv_transfer_params


def _post(url: str, body: dict):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=TIMEOUT_S)  # noqa: S310 - 127.0.0.1 servers of the test


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass  # no line per request on the test's stderr

    def do_GET(self):
        self._reply(200 if self.path == "/health" else 404, b"{}")

    def do_POST(self):
        if self.path != "/v1/completions":
            self._reply(404, b"{}")
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        proxy = self.server.proxy
        try:
            step = proxy.prefill(body)
            upstream = _post(proxy.decode_url + self.path, dict(body, kv_transfer_params=step.kv_transfer_params))
        except urllib.error.HTTPError as e:
            self._reply(e.code, e.read())
            return
        except (urllib.error.URLError, OSError, ValueError) as e:
            self._reply(502, json.dumps({"error": f"pd proxy: {e!r}"}).encode())
            return
        with upstream:
            self.send_response(upstream.status)
            self.send_header("Content-Type", upstream.headers.get("Content-Type", "application/json"))
            self.send_header("Connection", "close")
            self.end_headers()
            while chunk := upstream.read1(65536):  # streamed as the decoder sends it
                self.wfile.write(chunk)
                self.wfile.flush()
        self.close_connection = True

    def _reply(self, code: int, payload: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: "PDProxy"


class PDProxy:
    def __init__(self, prefill_url: str, decode_url: str) -> None:
        self.prefill_url = prefill_url
        self.decode_url = decode_url
        self.history: list[PrefillStep] = []
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="pd-proxy", daemon=True)

    def prefill(self, body: dict) -> PrefillStep:
        """Step 1: the prompt's prefill, one token, KV written to the L2."""
        request = dict(body, max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
        for key in ("stream_options", "min_tokens"):  # a one-token, unstreamed request refuses them
            request.pop(key, None)
        with _post(self.prefill_url + "/v1/completions", request) as reply:
            out = json.load(reply)
        step = PrefillStep(out["id"], out.get("kv_transfer_params"))
        self.history.append(step)
        return step

    def start(self) -> "PDProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "PDProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
