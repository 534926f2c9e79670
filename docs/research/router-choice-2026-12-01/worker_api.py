"""smg 1.13.0 worker API against two real llama-servers (SmolLM2, -t 1, --api-key K) on loopback: zero
workers, POST /workers (with the worker key), a dead URL, DELETE mid-stream, a killed worker, SIGTERM.
Output: worker_api.out (first column: seconds since the router was started). Paths are this machine's."""
import json, os, signal, subprocess, sys, time, urllib.request, urllib.error
LS = [l for l in os.popen("ls /root/.cache/kiln/binaries/*/prefix/bin/llama-server").read().split()][0]
M = "/root/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf"
SMG = "/work/research/router/venv-smg/bin/smg"
K = "K"
def http(url, key=K, body=None, method=None, timeout=30):
    h = {"Content-Type": "application/json"}
    if key: h["Authorization"] = "Bearer " + key
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r: return r.status, r.read().decode()
    except urllib.error.HTTPError as e: return e.code, e.read().decode()
    except OSError as e: return 0, str(e)
t0 = time.monotonic()
def say(*a): print(f"{time.monotonic()-t0:7.2f}", *a, flush=True)
R = "http://127.0.0.1:19200"
reps = {p: subprocess.Popen([LS, "-m", M, "--host", "127.0.0.1", "--port", str(p), "-t", "1", "-c", "2048", "-np", "1", "--api-key", K], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True) for p in (19201, 19202)}
t0 = time.monotonic()
smg = subprocess.Popen([SMG, "launch", "--host", "127.0.0.1", "--port", "19200", "--policy", "cache_aware", "--api-key", K, "--prometheus-port", "19209", "--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", "20", "--health-check-interval-secs", "2", "--health-failure-threshold", "1", "--health-success-threshold", "1", "--log-level", "info"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "NO_COLOR": "1"})
while http(R + "/liveness", key=None, timeout=1)[0] != 200: time.sleep(0.05)
say("liveness up (zero workers)")
for p in ("/liveness", "/readiness", "/health", "/v1/models", "/workers"):
    say("zero workers", p, http(R + p, key=None, timeout=3))
say("chat zero workers", http(R + "/v1/chat/completions", body={"model": M, "messages": [{"role":"user","content":"hi"}], "max_tokens": 2}))
for p in (19201, 19202):
    while http(f"http://127.0.0.1:{p}/health", key=None, timeout=1)[0] != 200: time.sleep(0.1)
say("replicas healthy")
c, b = http(R + "/workers", body={"url": "http://127.0.0.1:19201", "api_key": K}); say("POST /workers", c, b)
c, b = http(R + "/workers", body={"url": "http://127.0.0.1:19201", "api_key": K}); say("POST /workers again", c, b)
while True:
    c, b = http(R + "/readiness", key=None)
    if c == 200: break
    time.sleep(0.05)
say("readiness 200 after add", b)
say("workers", [(w["url"], w["status"], w["is_healthy"]) for w in json.loads(http(R + "/workers")[1])["workers"]])
# an unreachable url
c, b = http(R + "/workers", body={"url": "http://127.0.0.1:19299", "api_key": K}); say("POST /workers dead url", c, b)
for i in range(8):
    time.sleep(0.5); say("workers", [(w["url"], w["status"], w["is_healthy"]) for w in json.loads(http(R + "/workers")[1])["workers"]])
# add the second, then DELETE the first by id
c,b=http(R + "/workers", body={"url": "http://127.0.0.1:19202", "api_key": K}); say("add 19202", c)
while len([w for w in json.loads(http(R + "/workers")[1])["workers"] if w["status"]=="ready"]) < 2: time.sleep(0.05)
say("both ready")
ws = json.loads(http(R + "/workers")[1])["workers"]
say("workers", [(w["url"], w["id"][:8], w["status"]) for w in ws])
wid = [w["id"] for w in ws if w["url"].endswith("19201")][0]
# stream a request, delete mid-stream
import threading
out = {}
def stream():
    req = urllib.request.Request(R + "/v1/chat/completions", data=json.dumps({"model": M, "messages": [{"role":"user","content":"Write a long story about a fox."}], "max_tokens": 60, "stream": True}).encode(), headers={"Authorization": "Bearer K", "Content-Type": "application/json"})
    n = 0
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            for line in r:
                if line.startswith(b"data:"): n += 1
                if b"[DONE]" in line: out["done"] = True
    except Exception as e: out["err"] = repr(e)
    out["chunks"] = n
th = threading.Thread(target=stream); th.start(); time.sleep(1.0)
c, b = http(R + f"/workers/{wid}", method="DELETE"); say("DELETE", c, b)
for i in range(6):
    time.sleep(0.3); say("workers", [(w["url"], w["status"]) for w in json.loads(http(R + "/workers")[1])["workers"]])
th.join(); say("stream after delete", out)
# kill replica 19202 and see health
os.killpg(reps[19202].pid, signal.SIGKILL)
say("killed 19202")
for i in range(10):
    time.sleep(0.5); say("workers", [(w["url"], w["status"], w["is_healthy"]) for w in json.loads(http(R + "/workers")[1])["workers"]], "readiness", http(R + "/readiness", key=None)[0])
say("chat now", http(R + "/v1/chat/completions", body={"model": M, "messages": [{"role":"user","content":"hi"}], "max_tokens": 2})[0])
os.killpg(smg.pid, signal.SIGTERM); t1=time.monotonic(); smg.wait(); say("smg exit", smg.returncode, "after", round(time.monotonic()-t1,2))
for p in reps.values():
    try: os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError: pass
