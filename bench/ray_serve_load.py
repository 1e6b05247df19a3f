"""Load test of `specpack serve --ray`'s app on a local Ray cluster: throughput per replica count, errors, time to
first token; with --kill, one replica's process is killed mid-run and every request's outcome is recorded.

For each count in --replicas, the app is deployed (ray_app.application) with that many replicas, then --clients
threads send --requests streamed greedy completions with the official openai client (no retries: every failure is
counted). --kill S: S seconds into the run, one replica actor is killed (ray.kill); the report says how each request
ended (ok, the error's type) and how long Serve took to have every replica running again.

    PYTHONPATH=$PWD python bench/ray_serve_load.py PACK [--replicas 1,2] [--requests 64] [--clients 4]
        [--max-tokens 32] [--kill 2] [--json bench/results/ray_serve_load_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import ray
from ray import serve

from specpack.serve.config import ServeConfig
from specpack.serve.ray_app import DEPLOYMENT_NAME, application
from specpack.serve.ray_config import RayScaling
from specpack.serve.ray_host import init_ray

APP, MODEL, PROMPT = "specpack", "bench", "def quicksort(arr):\n    "


def one_request(client: openai.OpenAI, max_tokens: int) -> dict[str, Any]:
    start = time.monotonic()
    first: float | None = None
    pieces = 0
    try:
        stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=max_tokens, temperature=0, stream=True)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                first = first or time.monotonic() - start
                pieces += 1
        return {"outcome": "ok", "ttft_s": first, "s": time.monotonic() - start, "pieces": pieces}
    except Exception as err:  # every failure is a result here
        return {"outcome": type(err).__name__, "detail": str(err)[:200], "s": time.monotonic() - start, "pieces": pieces}


def running_replicas() -> int:
    status = serve.status().applications[APP].deployments[DEPLOYMENT_NAME]
    return sum(n for state, n in status.replica_states.items() if "RUNNING" in str(state))


def replica_names() -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "SERVE_REPLICA" in a["name"]}


def kill_one_replica(after_s: float, report: dict[str, Any]) -> None:
    """Kill one replica's actor; recovered: a replica that was not there before is up and as many run as before."""
    time.sleep(after_s)
    before = replica_names()
    victim = sorted(before)[0]
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    killed = time.monotonic()
    report["killed"] = victim
    while not (replica_names() - before and running_replicas() >= len(before)):
        time.sleep(0.2)
        if time.monotonic() - killed > 120:
            report["recovered_s"] = None
            return
    report["recovered_s"] = round(time.monotonic() - killed, 2)


def run(url: str, pack: Path, replicas: int, args: argparse.Namespace) -> dict[str, Any]:
    serve.run(application(ServeConfig(pack, model_name=MODEL), RayScaling(replicas=replicas)), name=APP,
              route_prefix="/")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    one_request(client, 2)  # warm: the proxy's routes, each replica's first request
    report: dict[str, Any] = {"replicas": replicas}
    killer = threading.Thread(target=kill_one_replica, args=(args.kill, report)) if args.kill is not None else None
    start = time.monotonic()
    if killer is not None:
        killer.start()
    with ThreadPoolExecutor(args.clients) as pool:
        results = list(pool.map(lambda _: one_request(client, args.max_tokens), range(args.requests)))
    wall = time.monotonic() - start
    if killer is not None:
        killer.join()
    ok = [r for r in results if r["outcome"] == "ok"]
    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    report.update(requests=len(results), wall_s=round(wall, 2), requests_per_s=round(len(ok) / wall, 2),
                  pieces_per_s=round(sum(r["pieces"] for r in ok) / wall, 1), outcomes=outcomes,
                  ttft_p50_s=round(statistics.median(r["ttft_s"] for r in ok if r["ttft_s"]), 3) if ok else None,
                  errors=[r for r in results if r["outcome"] != "ok"][:5], longest_s=round(max(r["s"] for r in results), 2))
    serve.delete(APP)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack", type=Path)
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--kill", type=float, default=None, help="seconds into each run: kill one replica")
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    init_ray(None, num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)  # as `specpack serve --ray`
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        reports = [run(f"http://127.0.0.1:{port}", args.pack, int(n), args) for n in args.replicas.split(",")]
    finally:
        serve.shutdown()
        ray.shutdown()
    text = json.dumps({"pack": str(args.pack), "clients": args.clients, "max_tokens": args.max_tokens,
                       "runs": reports}, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
