"""A lab-only scheduler extender that decides nothing, on the same stack as kube-qos-extender (aiohttp, orjson).

Its filter keeps every node kube-scheduler offers; its bind POSTs the Binding as asked. bench/e2e_throughput.py
--null python runs it to measure the floor of a Python extender with a filter and a bind round trip per pod,
apart from anything kube-qos-extender decides (bench/null_extender/main.go is the same in Go: the floor of any
extender). Never shipped.

    python bench/null_extender.py --listen-port P --server URL --ca F --cert F --key F
"""

from __future__ import annotations

import argparse
import ssl

import aiohttp
import orjson
from aiohttp import web


def app(server: str, ctx: ssl.SSLContext, max_conns: int) -> web.Application:
    session: dict[str, aiohttp.ClientSession] = {}

    async def start(_: web.Application) -> None:
        session["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max_conns, ssl=ctx))

    async def stop(_: web.Application) -> None:
        await session["s"].close()

    # kube-scheduler's extender types carry no JSON tags: the keys are the Go field names (EXTENDER-PROTOCOL.md);
    # Go's decoder matches them case-insensitively, a dict does not.
    async def filter_(request: web.Request) -> web.Response:
        args = orjson.loads(await request.read())
        out = {"NodeNames": args.get("NodeNames"), "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        return web.Response(body=orjson.dumps(out), content_type="application/json")

    async def bind(request: web.Request) -> web.Response:
        a = orjson.loads(await request.read())
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": a["PodName"], "uid": a["PodUID"]},
            "target": {"kind": "Node", "name": a["Node"]},
        }
        url = f"{server}/api/v1/namespaces/{a['PodNamespace']}/pods/{a['PodName']}/binding"
        error = ""
        try:
            async with session["s"].post(
                url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
            ) as resp:
                text = await resp.read()
                if resp.status not in (200, 201):
                    error = f"binding: {resp.status} {text[:200]!r}"
        except aiohttp.ClientError as e:
            error = f"binding: {e}"
        return web.Response(body=orjson.dumps({"Error": error}), content_type="application/json")

    a = web.Application()
    a.on_startup.append(start)
    a.on_cleanup.append(stop)
    a.router.add_post("/filter", filter_)
    a.router.add_post("/bind", bind)
    return a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen-port", type=int, required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--max-conns", type=int, default=64)
    args = ap.parse_args()
    ctx = ssl.create_default_context(cafile=args.ca)
    ctx.load_cert_chain(args.cert, args.key)
    web.run_app(
        app(args.server, ctx, args.max_conns), host="127.0.0.1", port=args.listen_port, access_log=None, print=None
    )


if __name__ == "__main__":
    main()
