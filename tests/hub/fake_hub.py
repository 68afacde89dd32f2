#!/usr/bin/env python3
"""A stand-in for the Hugging Face hub over HTTPS, and an HTTP CONNECT proxy, for
tests/test_model_pull.sh (Python 3 standard library only; no network beyond loopback).

  fake_hub.py hub --config C.json --cert CERT --key KEY --port-file F --stats S.json [--plain]
  fake_hub.py proxy --port-file F --log TUNNELS.log

The hub serves, as huggingface.co does:
  GET /api/models/OWNER/NAME[?blobs=true]  the listing: sha (the commit) and siblings with rfilename,
                                          size and lfs {sha256, size}; 404 for an unknown repository,
                                          401 for a gated one without its token
  GET /OWNER/NAME/resolve/REV/FILE        302 to the "CDN" with ETag, X-Linked-Etag (the sha256) and
                                          X-Linked-Size; the CDN is https://localhost:PORT/cdn/... while
                                          the hub is 127.0.0.1, so a client must not send the token there
  GET /cdn/OWNER/NAME/FILE                the bytes, with Range (206 + Content-Range)
C.json: {"repos": {"OWNER/NAME": {"dir": DIR, "token": T, "bad_sha": bool, "bad_etag": bool,
                                    "drop_first": bool, "no_range": bool}}}
  token       the repository is gated: the listing and resolve need "Authorization: Bearer T"
  bad_sha     the listing and X-Linked-Etag give a wrong sha256 for every GGUF
  bad_etag    the listing is right, X-Linked-Etag is not
  drop_first  the first transfer of each file stops halfway: the connection is dropped
  no_range    the CDN ignores Range (answers 200 with the whole file)
S.json, rewritten after every request: {"requests": all requests, "cdn_auth": requests to the CDN that carried
Authorization, "files": {"OWNER/NAME/FILE": {"requests", "range_requests", "bytes"}}}.
The proxy appends one line per tunnel (its target) to TUNNELS.log.
"""
import argparse
import hashlib
import json
import os
import select
import socket
import socketserver
import ssl
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def write_atomic(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Hub:
    def __init__(self, config, stats_path):
        self.repos = config["repos"]
        self.stats_path = stats_path
        self.lock = threading.Lock()
        self.stats = {"requests": 0, "cdn_auth": 0, "files": {}}
        self.transfers = {}  # file key -> transfers started (drop_first drops the first)
        self.save()

    def save(self):
        write_atomic(self.stats_path, json.dumps(self.stats))

    def files(self, repo):
        root = self.repos[repo]["dir"]
        out = []
        for d, _, names in os.walk(root):
            for n in names:
                p = os.path.join(d, n)
                out.append(os.path.relpath(p, root))
        return sorted(out)

    def sha256(self, repo, rel):
        if self.repos[repo].get("bad_sha") and rel.endswith(".gguf"):
            return hashlib.sha256(b"not the file's bytes").hexdigest()
        return file_sha256(os.path.join(self.repos[repo]["dir"], rel))

    def commit(self, repo):
        return hashlib.sha1(repo.encode()).hexdigest()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub = None  # set by main

    def log_message(self, fmt, *args):
        sys.stderr.write("fake_hub: " + (fmt % args) + "\n")

    def reply(self, status, body=b"", headers=None, content_type="application/json"):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def authorized(self, repo):
        token = self.hub.repos[repo].get("token")
        return not token or self.headers.get("Authorization") == f"Bearer {token}"

    def do_GET(self):
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        parts = path.strip("/").split("/")
        hub = self.hub
        with hub.lock:
            hub.stats["requests"] += 1
            hub.save()
        if parts[:2] == ["api", "models"] and len(parts) == 4:
            repo = "/".join(parts[2:4])
            if repo not in hub.repos:
                return self.reply(404, {"error": "Repository not found"})
            if not self.authorized(repo):
                return self.reply(401, {"error": f"Access to model {repo} is restricted."})
            siblings = []
            for rel in hub.files(repo):
                size = os.path.getsize(os.path.join(hub.repos[repo]["dir"], rel))
                s = {"rfilename": rel, "size": size}
                if rel.endswith(".gguf"):
                    s["lfs"] = {"sha256": hub.sha256(repo, rel), "size": size, "pointerSize": 134}
                siblings.append(s)
            return self.reply(200, {"id": repo, "sha": hub.commit(repo), "siblings": siblings})
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, rev, rel = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            if repo not in hub.repos:
                return self.reply(404, {"error": "Repository not found"})
            if not self.authorized(repo):
                return self.reply(401, {"error": f"Access to model {repo} is restricted."})
            full = os.path.join(hub.repos[repo]["dir"], rel)
            if rev not in ("main", hub.commit(repo)) or not os.path.isfile(full):
                return self.reply(404, {"error": "Entry not found"})
            sha = hub.sha256(repo, rel)
            if hub.repos[repo].get("bad_etag"):
                sha = hashlib.sha256(b"another file's bytes").hexdigest()
            port = self.server.server_address[1]
            scheme = "http" if self.server.plain else "https"
            loc = f"{scheme}://localhost:{port}/cdn/{repo}/{urllib.parse.quote(rel)}?sig=signed"
            return self.reply(302, b"", {"Location": loc, "ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"',
                                         "X-Linked-Size": str(os.path.getsize(full)),
                                         "X-Repo-Commit": hub.commit(repo)})
        if parts[0] == "cdn" and len(parts) >= 4:
            return self.cdn("/".join(parts[1:3]), "/".join(parts[3:]))
        return self.reply(404, {"error": "no such endpoint"})

    def cdn(self, repo, rel):
        hub = self.hub
        if repo not in hub.repos or not os.path.isfile(os.path.join(hub.repos[repo]["dir"], rel)):
            return self.reply(404, {"error": "Entry not found"})
        conf = hub.repos[repo]
        with open(os.path.join(conf["dir"], rel), "rb") as f:
            data = f.read()
        key = f"{repo}/{rel}"
        rng = self.headers.get("Range")
        start = 0
        if rng and not conf.get("no_range"):
            start = int(rng.split("=", 1)[1].split("-", 1)[0])
        with hub.lock:
            if self.headers.get("Authorization"):
                hub.stats["cdn_auth"] += 1
            st = hub.stats["files"].setdefault(key, {"requests": 0, "range_requests": 0, "bytes": 0})
            st["requests"] += 1
            st["range_requests"] += 1 if rng else 0
            first = hub.transfers.get(key, 0) == 0
            hub.transfers[key] = hub.transfers.get(key, 0) + 1
        if start >= len(data) and rng and not conf.get("no_range"):
            hub.save()
            return self.reply(416, b"", {"Content-Range": f"bytes */{len(data)}"})
        body = data[start:]
        drop = conf.get("drop_first") and first
        sent = body[: len(body) // 2] if drop else body
        with hub.lock:
            st["bytes"] += len(sent)
            hub.save()
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self.wfile.write(sent)
        if drop:  # the connection dies halfway through the file
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class ProxyHandler(socketserver.BaseRequestHandler):
    log_path = None
    lock = threading.Lock()

    def handle(self):
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode()
        method, target = line.split(" ")[:2]
        if method != "CONNECT":
            self.request.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        host, port = target.rsplit(":", 1)
        try:
            up = socket.create_connection((host.strip("[]"), int(port)))
        except OSError:
            self.request.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        with self.lock:
            with open(self.log_path, "a") as f:
                f.write(target + "\n")
        self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        socks = [self.request, up]
        try:
            while True:
                ready, _, _ = select.select(socks, [], [], 60)
                if not ready:
                    break
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (up if s is self.request else self.request).sendall(data)
        except OSError:
            pass
        finally:
            up.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["hub", "proxy"])
    ap.add_argument("--config")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--stats")
    ap.add_argument("--log")
    ap.add_argument("--plain", action="store_true", help="plain HTTP instead of HTTPS")
    a = ap.parse_args()
    if a.mode == "hub":
        with open(a.config) as f:
            Handler.hub = Hub(json.load(f), a.stats)
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.plain = a.plain
        if not a.plain:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(a.cert, a.key)
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
    else:
        ProxyHandler.log_path = a.log
        open(a.log, "a").close()
        socketserver.ThreadingTCPServer.daemon_threads = True
        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), ProxyHandler)
    server.daemon_threads = True
    write_atomic(a.port_file, str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
