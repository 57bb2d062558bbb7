#!/usr/bin/env python3
"""TCP relay from an address inside a network namespace to 127.0.0.1 of the host's namespace.

Why: the local kube-apiserver binds 127.0.0.1 only (nothing on this machine may listen on a host address),
but kubelets, kube-proxy and pods of real nodes live in network namespaces hack/real-nodes.sh creates, where
127.0.0.1 is their own loopback. This relay creates its listening socket inside the namespace (setns for that
one call; a socket stays in the namespace it was created in) and dials the target from the host namespace,
so the apiserver is reachable at e.g. 10.250.0.2:6443 from every node and pod, and nowhere else.

Usage: netns_relay.py --netns qos-apigw --listen 10.250.0.2:6443 --connect 127.0.0.1:6443
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import socket

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def listen_in_netns(netns: str, host: str, port: int) -> socket.socket:
    """A listening socket created inside ``netns``; the calling thread returns to its own namespace."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(512)
            sock.setblocking(False)
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)
    return sock


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


async def serve(sock: socket.socket, target_host: str, target_port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, sock=sock)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--netns", required=True)
    parser.add_argument("--listen", required=True, help="HOST:PORT inside the namespace")
    parser.add_argument("--connect", required=True, help="HOST:PORT in this process's namespace")
    args = parser.parse_args()
    lhost, lport = args.listen.rsplit(":", 1)
    chost, cport = args.connect.rsplit(":", 1)
    sock = listen_in_netns(args.netns, lhost, int(lport))
    asyncio.run(serve(sock, chost, int(cport)))


if __name__ == "__main__":
    main()
