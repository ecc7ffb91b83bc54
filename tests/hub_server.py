"""A small Hugging Face Hub server on loopback, for tests that push and pull with the real huggingface_hub client.

It implements the HTTP routes that huggingface_hub 2.4 and transformers use to create a repository, commit to
it (preupload, git-lfs batch/upload/verify, NDJSON commit), create branches, and read it back (model_info,
tree, refs, HEAD/GET resolve). Repositories have real branches: each commit has a 40-hex oid, a parent and its
own file tree, so `from_pretrained(repo_id, revision="v2")` sees the files of that branch only.

File contents live on disk under the server's folder (git blobs by sha1, LFS objects by sha256); the repository
metadata (branches, commits, trees) lives in memory. Xet is not served: clients must run with
`HF_HUB_DISABLE_XET=1` (then large and binary files go through the classic LFS batch API).

Usage (see the `hub_server` fixture in tests/conftest.py)::

    server = HubServer(tmp_dir)
    server.start()
    subprocess.run([...], env={**os.environ, **server.env()})
    server.fail_next("commit")  # the next commit request answers 500
    server.stop()

Run it by hand with `python tests/hub_server.py [--port N]` (Ctrl-C stops it).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qs, quote, unquote, urlsplit

import yaml

# The Hub's default .gitattributes: these patterns (and any binary or > 10 MB file) are stored with git-lfs.
LFS_PATTERNS = (
    "*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gz *.h5 *.joblib *.lfs.* *.mlmodel *.model *.msgpack *.npy *.npz "
    "*.onnx *.ot *.parquet *.pb *.pickle *.pkl *.pt *.pth *.rar *.safetensors *.tar.* *.tar *.tflite *.tgz *.wasm "
    "*.xz *.zip *.zst *tfevents*"
).split()
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS).encode()
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024
REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
USER = "test-user"
ROUTES = (
    "create_repo validate_yaml whoami preupload commit create_branch delete_branch repo_info tree refs "
    "lfs_batch lfs_upload lfs_verify resolve"
).split()


def git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


class HubError(Exception):
    """An error answered to the client: status, optional X-Error-Code, message."""

    def __init__(self, status: int, message: str, code: str | None = None, body: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.body = status, message, code, body


@dataclass(frozen=True)
class Entry:
    """One file of a tree. `oid` is the git blob sha1 (of the pointer file for LFS); `sha256` is set for LFS."""

    oid: str
    size: int
    sha256: str | None = None

    @property
    def is_lfs(self) -> bool:
        return self.sha256 is not None


@dataclass
class Commit:
    oid: str
    parent: str | None
    tree: dict[str, Entry]
    title: str
    description: str
    date: float


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit oid
    tags: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit:
        name = revision.removeprefix("refs/heads/").removeprefix("refs/tags/")
        oid = self.branches.get(name) or self.tags.get(name)
        if oid is None and re.fullmatch(r"[0-9a-f]{7,40}", revision):
            matches = [c for c in self.commits if c.startswith(revision)]
            oid = matches[0] if len(matches) == 1 else None
        if oid is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return self.commits[oid]


class HubState:
    """Repositories, blobs and LFS objects, shared by the request threads (one lock)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.blobs = self.root / "blobs"
        self.lfs = self.root / "lfs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.lfs.mkdir(parents=True, exist_ok=True)
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lock = threading.RLock()
        self._counter = 0

    # --- storage
    def put_blob(self, content: bytes) -> Entry:
        oid = git_blob_sha1(content)
        path = self.blobs / oid
        if not path.exists():
            path.write_bytes(content)
        return Entry(oid=oid, size=len(content))

    def lfs_path(self, sha256: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise HubError(400, f"Invalid LFS oid {sha256!r}")
        return self.lfs / sha256

    def read(self, entry: Entry) -> Path:
        return self.lfs_path(entry.sha256) if entry.is_lfs else self.blobs / entry.oid

    # --- repositories
    def get_repo(self, repo_type: str, repo_id: str, authorized: bool = True) -> Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None or (repo.private and not authorized):
            status = 401 if repo is not None else 404
            raise HubError(status, f"Repository Not Found for url: {repo_type} {repo_id}", "RepoNotFound")
        return repo

    def create_repo(self, repo_type: str, repo_id: str, private: bool) -> Repo:
        if (repo_type, repo_id) in self.repos:
            raise HubError(409, "You already created this repo", body={"url": repo_id})
        repo = Repo(repo_type=repo_type, repo_id=repo_id, private=private)
        self.repos[(repo_type, repo_id)] = repo
        self.commit(repo, "main", {".gitattributes": self.put_blob(GITATTRIBUTES)}, [], "initial commit", "")
        return repo

    def commit(
        self,
        repo: Repo,
        branch: str,
        additions: dict[str, Entry],
        deletions: list[tuple[str, bool]],
        title: str,
        description: str,
        parent_commit: str | None = None,
    ) -> Commit:
        parent = repo.branches.get(branch)
        if parent is None and repo.commits:
            raise HubError(404, f"Invalid rev id: {branch} (commits go to a branch)", "RevisionNotFound")
        if parent_commit is not None and parent is not None and not parent.startswith(parent_commit):
            raise HubError(412, f"Parent commit {parent_commit} is not the head of {branch} ({parent})")
        tree = dict(repo.commits[parent].tree) if parent else {}
        for path, is_folder in deletions:
            if is_folder:
                prefix = path.rstrip("/") + "/"
                doomed = [p for p in tree if p.startswith(prefix)]
            else:
                doomed = [path] if path in tree else []
            if not doomed:
                raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
            for p in doomed:
                del tree[p]
        tree.update(additions)
        self._counter += 1
        payload = json.dumps(
            {"parent": parent, "tree": {p: e.oid for p, e in sorted(tree.items())}, "title": title, "n": self._counter}
        )
        oid = hashlib.sha1(payload.encode()).hexdigest()
        commit = Commit(oid=oid, parent=parent, tree=tree, title=title, description=description, date=time.time())
        repo.commits[oid] = commit
        repo.branches[branch] = oid
        return commit


def _is_lfs(path: str, sample: bytes, size: int) -> bool:
    name = PurePosixPath(path).name
    return size > LFS_SIZE_THRESHOLD or b"\0" in sample or any(fnmatch.fnmatch(name, p) for p in LFS_PATTERNS)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client expects; every answer carries a Content-Length
    timeout = 60
    server: _Server

    # --- plumbing
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass  # requests are recorded in `HubServer.requests` instead of printed

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _body(self) -> bytes:
        if getattr(self, "_body_read", False):
            return b""
        self._body_read = True
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json_body(self) -> dict:
        try:
            data = json.loads(self._body() or b"{}")
        except json.JSONDecodeError as err:
            raise HubError(400, f"Invalid JSON body: {err}") from err
        if not isinstance(data, dict):
            raise HubError(400, "The JSON body must be an object")
        return data

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, content_type="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _send_json(self, data, status: int = 200, headers: dict | None = None, content_type="application/json"):
        self._send(status, json.dumps(data).encode(), headers, content_type)

    @property
    def base(self) -> str:
        return self.server.hub.url

    @property
    def authorized(self) -> bool:
        return self.headers.get("Authorization", "").startswith("Bearer ")

    @property
    def token(self) -> str | None:
        header = self.headers.get("Authorization", "")
        return header.removeprefix("Bearer ") if header.startswith("Bearer ") else None

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        self._body_read = False
        self._resolved_commit = None  # the handler lives as long as its (kept-alive) connection: reset per request
        self.query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        segments = [unquote(s) for s in url.path.strip("/").split("/")] if url.path.strip("/") else []
        hub = self.server.hub
        route, args = None, ()
        try:
            route, handler, args = self._route(method, segments)
            hub._record(method, route, url.path, self.headers)
            if self.token in hub.invalid_tokens:
                raise HubError(401, "Invalid credentials in Authorization header")
            if self.token in hub.read_tokens and method != "GET":
                raise HubError(403, "You don't have the rights to write with this token")
            fault = hub._take_fault(route, url.path)
            if fault is not None:
                raise HubError(fault[0], fault[1], "InjectedFault")
            handler(*args)
        except HubError as err:
            if route is None:
                hub._record(method, "unrouted", url.path, self.headers, error=err.message)
            self._body()  # drain an unread request body, so the kept-alive connection stays in sync
            body = {"error": err.message, **(err.body or {})}
            headers = {"X-Error-Message": err.message}
            if err.code:
                headers["X-Error-Code"] = err.code
            if err.code in ("EntryNotFound", "RevisionNotFound") and route == "resolve" and len(args) > 1:
                # the client caches "file absent at this commit" from this header
                if self._resolved_commit:
                    headers["X-Repo-Commit"] = self._resolved_commit
            self._send_json(body, err.status, headers)
        except Exception as err:  # a bug in the server: answer 500 with the reason instead of hanging the client
            hub._record(method, route or "?", url.path, self.headers, error=repr(err))
            self._send_json({"error": f"test hub server error: {err!r}"}, 500)

    def _route(self, method: str, s: list[str]):
        if s[:1] == ["api"]:
            rest = s[1:]
            if method == "POST" and rest == ["repos", "create"]:
                return "create_repo", self.create_repo, ()
            if method == "POST" and rest == ["validate-yaml"]:
                return "validate_yaml", self.validate_yaml, ()
            if method == "GET" and rest[:1] in (["whoami-v2"], ["whoami"]):
                return "whoami", self.whoami, ()
            if len(rest) >= 3 and rest[0] in REPO_TYPES:
                repo_type, repo_id, tail = REPO_TYPES[rest[0]], f"{rest[1]}/{rest[2]}", rest[3:]
                key = (repo_type, repo_id)
                if method == "POST" and len(tail) == 2 and tail[0] == "preupload":
                    return "preupload", self.preupload, (key, tail[1])
                if method == "POST" and len(tail) == 2 and tail[0] == "commit":
                    return "commit", self.commit, (key, tail[1])
                if method == "POST" and len(tail) == 2 and tail[0] == "branch":
                    return "create_branch", self.create_branch, (key, tail[1])
                if method == "DELETE" and len(tail) == 2 and tail[0] == "branch":
                    return "delete_branch", self.delete_branch, (key, tail[1])
                if method == "GET" and not tail:
                    return "repo_info", self.repo_info, (key, "main")
                if method == "GET" and len(tail) == 2 and tail[0] == "revision":
                    return "repo_info", self.repo_info, (key, tail[1])
                if method == "GET" and len(tail) >= 2 and tail[0] == "tree":
                    return "tree", self.tree, (key, tail[1], "/".join(tail[2:]))
                if method == "GET" and tail == ["refs"]:
                    return "refs", self.refs, (key,)
        if s[:1] == ["lfs-objects"] and len(s) == 2 and method == "PUT":
            return "lfs_upload", self.lfs_upload, (s[1],)
        if s[:1] == ["lfs-objects"] and len(s) == 3 and s[2] == "verify" and method == "POST":
            return "lfs_verify", self.lfs_verify, (s[1],)
        prefix_type = "model"
        if s[:1] and s[0] in ("datasets", "spaces"):
            prefix_type, s = REPO_TYPES[s[0]], s[1:]
        if len(s) == 6 and s[1].endswith(".git") and s[2:] == ["info", "lfs", "objects", "batch"] and method == "POST":
            return "lfs_batch", self.lfs_batch, ((prefix_type, f"{s[0]}/{s[1][:-4]}"),)
        if len(s) >= 5 and s[2] == "resolve" and method in ("GET", "HEAD"):
            return "resolve", self.resolve, ((prefix_type, f"{s[0]}/{s[1]}"), s[3], "/".join(s[4:]))
        raise HubError(404, f"The test hub server has no route for {method} /{'/'.join(s)}")

    def _repo(self, key: tuple[str, str]) -> Repo:
        return self.server.hub.state.get_repo(*key, authorized=self.authorized)

    def _repo_url(self, repo: Repo) -> str:
        prefix = "" if repo.repo_type == "model" else f"{repo.repo_type}s/"
        return f"{self.base}/{prefix}{repo.repo_id}"

    # --- routes
    def whoami(self):
        if not self.authorized:
            raise HubError(401, "Invalid credentials in Authorization header")
        role = "read" if self.token in self.server.hub.read_tokens else "write"
        self._send_json({"type": "user", "name": USER, "orgs": [], "auth": {"accessToken": {"role": role}}})

    def create_repo(self):
        data = self._json_body()
        name, org = data.get("name"), data.get("organization") or USER
        if not isinstance(name, str) or not re.fullmatch(r"[\w.\-]{1,96}", name):
            raise HubError(400, f"Invalid repo name {name!r}")
        repo_type = data.get("type") or "model"
        if repo_type not in REPO_TYPES.values():
            raise HubError(400, f"Invalid repo type {repo_type!r}")
        private = data.get("visibility") == "private" or data.get("private") is True
        state = self.server.hub.state
        with state.lock:
            try:
                repo = state.create_repo(repo_type, f"{org}/{name}", private)
            except HubError as err:
                err.body = {"url": self._repo_url(state.repos[(repo_type, f"{org}/{name}")])}
                raise
        self._send_json({"url": self._repo_url(repo), "name": repo.repo_id, "id": repo.repo_id})

    def validate_yaml(self):
        data = self._json_body()
        content = data.get("content")
        if not isinstance(content, str):
            raise HubError(400, "`content` must be a string")
        errors, warnings = [], []
        match = re.match(r"^---\s*\n(.*?)\n---\s*\n", content, re.DOTALL)
        if match is None:
            warnings.append({"message": "Empty or missing yaml metadata in repo card"})
        else:
            try:
                metadata = yaml.safe_load(match.group(1))
            except yaml.YAMLError as err:
                errors.append({"message": f"Invalid YAML: {err}"})
            else:
                if metadata is not None and not isinstance(metadata, dict):
                    errors.append({"message": "The YAML metadata must be a mapping"})
                elif isinstance(metadata, dict) and "model-index" in metadata:
                    if not isinstance(metadata["model-index"], list):
                        errors.append({"message": '"model-index" must be an array'})
        self._send_json({"errors": errors, "warnings": warnings}, 400 if errors else 200)

    def preupload(self, key, revision):
        data = self._json_body()
        if self.query.get("create_pr"):
            raise HubError(400, "The test hub server does not support pull requests")
        state = self.server.hub.state
        with state.lock:
            head = self._repo(key).resolve(revision)
            tree = head.tree
        files = []
        for item in data.get("files", []):
            path, size = item["path"], int(item["size"])
            sample = base64.b64decode(item.get("sample", ""))
            lfs = _is_lfs(path, sample, size)
            existing = tree.get(path)
            oid = None
            if existing is not None and existing.is_lfs == lfs:
                oid = existing.sha256 if lfs else existing.oid
            files.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid})
        self._send_json({"files": files, "commitOid": head.oid})

    def lfs_batch(self, key):
        data = self._json_body()
        if data.get("operation") != "upload":
            raise HubError(400, f"Only LFS uploads are served, got operation {data.get('operation')!r}")
        repo = self._repo(key)
        ref = (data.get("ref") or {}).get("name")
        if ref:
            repo.resolve(ref)
        state = self.server.hub.state
        objects = []
        for obj in data.get("objects", []):
            oid, size = obj.get("oid"), obj.get("size")
            if not isinstance(oid, str) or not re.fullmatch(r"[0-9a-f]{64}", oid) or not isinstance(size, int):
                objects.append({"oid": str(oid), "size": int(size or 0), "error": {"code": 422, "message": "bad oid"}})
                continue
            entry = {"oid": oid, "size": size, "authenticated": True}
            if not state.lfs_path(oid).exists():
                entry["actions"] = {
                    "upload": {"href": f"{self.base}/lfs-objects/{oid}", "expires_in": 3600},
                    "verify": {"href": f"{self.base}/lfs-objects/{oid}/verify", "expires_in": 3600},
                }
            objects.append(entry)
        self._send_json(
            {"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
            content_type="application/vnd.git-lfs+json",
        )

    def lfs_upload(self, oid):
        state = self.server.hub.state
        path = state.lfs_path(oid)
        content = self._body()
        actual = hashlib.sha256(content).hexdigest()
        if actual != oid:
            raise HubError(400, f"Uploaded content has sha256 {actual}, expected {oid}")
        tmp = path.with_suffix(f".tmp{threading.get_ident()}")
        tmp.write_bytes(content)
        tmp.replace(path)
        self._send(200, b"", {"ETag": f'"{oid}"'})

    def lfs_verify(self, oid):
        data = self._json_body()
        path = self.server.hub.state.lfs_path(oid)
        if not path.exists():
            raise HubError(404, f"LFS object {oid} was never uploaded")
        if data.get("size") != path.stat().st_size:
            raise HubError(422, f"LFS object {oid} has size {path.stat().st_size}, not {data.get('size')}")
        self._send_json({"oid": oid, "size": path.stat().st_size})

    def commit(self, key, revision):
        if self.query.get("create_pr"):
            raise HubError(400, "The test hub server does not support pull requests")
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "The commit payload must start with a header line")
        header = lines[0]["value"]
        title = header.get("summary") or ""
        if not title:
            raise HubError(400, "The commit needs a summary")
        state = self.server.hub.state
        additions: dict[str, Entry] = {}
        deletions: list[tuple[str, bool]] = []
        for line in lines[1:]:
            kind, value = line.get("key"), line.get("value") or {}
            path = value.get("path", "")
            if not path or path.startswith("/") or ".." in PurePosixPath(path).parts:
                raise HubError(400, f"Invalid path in commit: {path!r}")
            if kind == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, f"Unsupported encoding {value.get('encoding')!r} for {path}")
                additions[path] = state.put_blob(base64.b64decode(value["content"]))
            elif kind == "lfsFile":
                oid = value.get("oid", "")
                lfs = state.lfs_path(oid)
                if not lfs.exists():
                    raise HubError(422, f"LFS object {oid} of {path} was not uploaded before the commit")
                size = lfs.stat().st_size
                additions[path] = Entry(oid=git_blob_sha1(lfs_pointer(oid, size)), size=size, sha256=oid)
            elif kind in ("deletedFile", "deletedFolder"):
                deletions.append((path, kind == "deletedFolder"))
            else:
                raise HubError(400, f"Unknown commit operation {kind!r}")
        with state.lock:
            repo = self._repo(key)
            repo.resolve(revision)  # RevisionNotFound for a branch that does not exist
            if revision not in repo.branches:
                raise HubError(400, f"Commits go to a branch; {revision!r} is not one")
            commit = state.commit(
                repo, revision, additions, deletions, title, header.get("description", ""), header.get("parentCommit")
            )
        self._send_json(
            {
                "success": True,
                "commitOid": commit.oid,
                "commitUrl": f"{self._repo_url(repo)}/commit/{commit.oid}",
                "hookOutput": "",
            }
        )

    def create_branch(self, key, branch):
        data = self._json_body()
        state = self.server.hub.state
        with state.lock:
            repo = self._repo(key)
            if branch in repo.branches:
                raise HubError(409, f"Reference refs/heads/{branch} already exists")
            if not re.fullmatch(r"[\w.\-/]+", branch) or branch.startswith("refs/"):
                raise HubError(400, f"Invalid branch name {branch!r}")
            start = repo.resolve(data.get("startingPoint") or "main")
            repo.branches[branch] = start.oid
        self._send_json({})

    def delete_branch(self, key, branch):
        state = self.server.hub.state
        with state.lock:
            repo = self._repo(key)
            if branch not in repo.branches or branch == "main":
                raise HubError(404 if branch not in repo.branches else 403, f"Cannot delete branch {branch!r}")
            del repo.branches[branch]
        self._send_json({})

    def repo_info(self, key, revision):
        state = self.server.hub.state
        with state.lock:
            repo = self._repo(key)
            commit = repo.resolve(revision)
            siblings = [{"rfilename": p} for p in sorted(commit.tree)]
            if self.query.get("blobs"):
                for sib in siblings:
                    entry = commit.tree[sib["rfilename"]]
                    sib.update({"blobId": entry.oid, "size": entry.size})
                    if entry.is_lfs:
                        sib["lfs"] = {"sha256": entry.sha256, "size": entry.size, "pointerSize": 134}
        self._send_json(
            {
                "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "author": repo.repo_id.split("/")[0],
                "sha": commit.oid,
                "lastModified": _iso(commit.date),
                "createdAt": _iso(min(c.date for c in repo.commits.values())),
                "private": repo.private,
                "gated": False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
            }
        )

    def tree(self, key, revision, path):
        state = self.server.hub.state
        recursive = self.query.get("recursive", "").lower() in ("1", "true")
        with state.lock:
            commit = self._repo(key).resolve(revision)
            prefix = path.strip("/") + "/" if path.strip("/") else ""
            files = {p: e for p, e in commit.tree.items() if p.startswith(prefix)}
            if prefix and not files:
                raise HubError(404, f"{path} does not exist at {revision}", "EntryNotFound")
            entries, folders = [], set()
            for p, e in sorted(files.items()):
                rest = p[len(prefix) :].split("/")
                for depth in range(1, len(rest)):
                    if depth > 1 and not recursive:
                        break
                    folder = prefix + "/".join(rest[:depth])
                    if folder not in folders:
                        folders.add(folder)
                        fid = hashlib.sha1(folder.encode() + commit.oid.encode()).hexdigest()
                        entries.append({"type": "directory", "oid": fid, "size": 0, "path": folder})
                if len(rest) == 1 or recursive:
                    item = {"type": "file", "oid": e.oid, "size": e.size, "path": p}
                    if e.is_lfs:
                        pointer_size = len(lfs_pointer(e.sha256, e.size))
                        item["lfs"] = {"oid": e.sha256, "size": e.size, "pointerSize": pointer_size}
                    entries.append(item)
        self._send_json(entries)

    def refs(self, key):
        with self.server.hub.state.lock:
            repo = self._repo(key)
            branches = [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": o} for n, o in repo.branches.items()]
            tags = [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": o} for n, o in repo.tags.items()]
        self._send_json({"branches": branches, "tags": tags, "converts": []})

    def resolve(self, key, revision, path):
        state = self.server.hub.state
        with state.lock:
            commit = self._repo(key).resolve(revision)
            self._resolved_commit = commit.oid
            entry = commit.tree.get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path} at {revision}", "EntryNotFound")
        file = state.read(entry)
        headers = {
            "X-Repo-Commit": commit.oid,
            "ETag": f'"{entry.sha256 if entry.is_lfs else entry.oid}"',
            "Accept-Ranges": "bytes",
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(PurePosixPath(path).name)}",
        }
        if entry.is_lfs:
            # what the Hub adds when it redirects an LFS file to its CDN; served in place here
            headers.update({"X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size)})
        status, content = 200, b""
        if self.command == "GET":
            content = file.read_bytes()
            range_header = self.headers.get("Range", "")
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header.strip())
            if match:
                start = int(match.group(1))
                end = int(match.group(2)) if match.group(2) else len(content) - 1
                headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
                content, status = content[start : end + 1], 206
            self._send(status, content, headers, content_type="application/octet-stream")
        else:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(entry.size))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    hub: HubServer


class HubServer:
    """The server, its state and its test controls (`fail_next`, `requests`, `repo`)."""

    def __init__(self, root: Path | str, host: str = "127.0.0.1", port: int = 0):
        self.root = Path(root)
        self.state = HubState(self.root / "storage")
        self.requests: list[dict] = []
        self._faults: dict[str, list[tuple[int, str, str | None]]] = {}
        self._lock = threading.Lock()
        # tokens every route answers 401, as the Hub answers an invalid or expired token; "read" tokens may not write
        self.invalid_tokens: set[str] = set()
        self.read_tokens: set[str] = set()
        self._httpd = _Server((host, port), _Handler)
        self._httpd.hub = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="test-hub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def env(self) -> dict[str, str]:
        """Environment for a client process: this endpoint, online, classic LFS (no xet), no telemetry."""
        return {
            "HF_ENDPOINT": self.url,
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_ETAG_TIMEOUT": "30",
            "HF_HUB_DOWNLOAD_TIMEOUT": "30",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }

    # --- test controls
    def fail_next(
        self, route: str, status: int = 500, message: str | None = None, times: int = 1, match: str | None = None
    ) -> None:
        """Make the next `times` requests to `route` (one of ROUTES) whose URL path contains `match` (any path
        when None; e.g. a repo id, or an LFS oid for "lfs_upload") answer `status` with X-Error-Code
        InjectedFault. Routes the client sends through `http_backoff` (preupload, lfs_batch, lfs_upload,
        lfs_verify, resolve) retry 429/5xx: inject a 4xx there, or enough `times`."""
        if route not in ROUTES:
            raise ValueError(f"Unknown route {route!r}; expected one of {ROUTES}")
        with self._lock:
            fault = (status, message or f"injected fault on {route}", match)
            self._faults.setdefault(route, []).extend([fault] * times)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take_fault(self, route: str, path: str) -> tuple[int, str] | None:
        with self._lock:
            queue = self._faults.get(route, [])
            for i, (status, message, match) in enumerate(queue):
                if match is None or match in path:
                    del queue[i]
                    return status, message
            return None

    def _record(self, method: str, route: str, path: str, headers, error: str | None = None) -> None:
        with self._lock:
            self.requests.append(
                {
                    "time": time.time(),
                    "method": method,
                    "route": route,
                    "path": path,
                    "authorization": headers.get("Authorization"),
                    "error": error,
                }
            )

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        with self.state.lock:
            return self.state.get_repo(repo_type, repo_id)

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, Entry]:
        with self.state.lock:
            return dict(self.state.get_repo(repo_type, repo_id).resolve(revision).tree)

    def read_file(self, repo_id: str, path: str, revision: str = "main", repo_type: str = "model") -> bytes:
        return self.state.read(self.files(repo_id, revision, repo_type)[path]).read_bytes()


def _main() -> None:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="Run the test Hub server on loopback until Ctrl-C.")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="test-hub-"))
    server = HubServer(root, port=args.port).start()
    print(f"HF_ENDPOINT={server.url} HF_HUB_OFFLINE=0 HF_HUB_DISABLE_XET=1  (storage: {root})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    _main()
