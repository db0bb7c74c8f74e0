"""The engine pod's adapter store: where the learner uploads each LoRA adapter before vLLM loads it.

`POST /v1/load_lora_adapter` takes a path on the engine's own filesystem. On one machine that is the learner's
sync directory; in a cluster the learner's checkpoint volume is mounted in the learner Pod only (ReadWriteOnce,
often on another node), so a small sidecar in each engine Pod receives the adapter over HTTP into a volume it
shares with vLLM, and the learner then loads it from there:

    PUT    /adapters/{name}   body: a tar of the adapter directory  -> StoredAdapter (the path vLLM can read)
    DELETE /adapters/{name}                                          -> 204
    GET    /healthz

Writes need `Authorization: Bearer <credential>`. The store's own token (a run's proxy admin token, or an
EnginePool's store token that only the operator holds) writes any name. On an EnginePool each run gets its own
credential, `store_credentials.run_credential(token, run)` (the operator puts it in the run's Secret): it writes and deletes only
that run's adapters, `<run>-v<N>`, so one run cannot replace or remove another's.

An upload streams to a file on the store's volume (never held in memory), then is unpacked into a temporary
directory and renamed into place, so vLLM never reads half an adapter. The tar must be uncompressed (as
`adapter_tar` writes it: safetensors do not shrink) and its members may not add up to more than the upload itself
(nor `MAX_MEMBERS` files): a small archive cannot unpack into a large tree.

It is served as every harnessrl server is (runtime/serving.py): a request's head bounded in size and time, its body
to `MAX_UPLOAD_BYTES` and `--body-timeout-seconds`. A write's credential is checked before a byte of its body is
read, and a refused write ends its connection, so the body it declared is never read.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import io
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from fastapi import FastAPI, Header, HTTPException, Request, Response
from harnessrl.runtime import logs, serving
from harnessrl.runtime.contracts.server_limits import ServerLimits
from harnessrl.runtime.contracts.store_credentials import owned, run_of
from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MAX_UPLOAD_BYTES = 2 * 1024**3  # LoRA adapters are megabytes to a few hundred
MAX_MEMBERS = 1000  # an adapter is a handful of files
UPLOAD_TIMEOUT_S = 600.0  # the largest upload at 30 MB/s; a trickled one is cut then (408)
CLOSE = {"connection": "close"}  # a write refused before its body is read ends its connection: the body never is
COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"\x28\xb5\x2f\xfd")  # gzip, bzip2, xz, zstd magic


class StoredAdapter(BaseModel):
    name: str = Field(pattern=NAME_PATTERN)
    path: str = Field(description="the adapter's directory as the engine sees it (give it to load_lora_adapter)")


def adapter_tar(directory: Path) -> bytes:
    """The adapter directory as the store takes it: an uncompressed tar of its files (safetensors do not shrink)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(directory.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    return buffer.getvalue()


def create_app(root: Path, token: str) -> FastAPI:
    root.mkdir(parents=True, exist_ok=True)
    app = FastAPI(title="harnessrl adapter store")

    def authorize(authorization: str | None, name: str) -> None:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode()):
            return
        run = run_of(token, given) if scheme.lower() == "bearer" else None
        if run is None:
            raise HTTPException(status_code=401, detail="a valid bearer token is required", headers=CLOSE)
        if not owned(run, name):
            raise HTTPException(status_code=403, detail=f"this credential writes only run {run}'s adapters "
                                                        f"({run}-v<N>), not {name}", headers=CLOSE)

    def checked(name: str) -> str:
        if re.fullmatch(NAME_PATTERN, name) is None:
            raise HTTPException(status_code=422, detail=f"adapter name {name!r} must match {NAME_PATTERN}")
        return name

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.put("/adapters/{name}", response_model=StoredAdapter)
    async def put(name: str, request: Request, authorization: str | None = Header(None)) -> StoredAdapter:
        authorize(authorization, checked(name))  # before a byte of the body is read
        if int(request.headers.get("content-length") or 0) > MAX_UPLOAD_BYTES:
            raise HTTPException(status_code=413, detail=f"adapter upload over {MAX_UPLOAD_BYTES} bytes", headers=CLOSE)
        fd, upload = tempfile.mkstemp(dir=root, prefix=".upload-")
        try:
            size = 0
            with os.fdopen(fd, "wb") as out:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > MAX_UPLOAD_BYTES:
                        raise HTTPException(status_code=413, detail=f"adapter upload over {MAX_UPLOAD_BYTES} bytes")
                    out.write(chunk)
            staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}."))
            try:
                await asyncio.to_thread(unpack, Path(upload), size, staging)
            except (tarfile.TarError, OSError, ValueError) as exc:
                shutil.rmtree(staging, ignore_errors=True)
                raise HTTPException(status_code=400, detail=f"not a usable adapter tar: {exc}") from None
        finally:
            os.unlink(upload)
        target = root / name
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        log.info("stored adapter %s (%d bytes)", name, size)
        return StoredAdapter(name=name, path=str(target.resolve()))

    @app.delete("/adapters/{name}", status_code=204)
    async def delete(name: str, authorization: str | None = Header(None)) -> Response:
        authorize(authorization, checked(name))
        shutil.rmtree(root / name, ignore_errors=True)
        return Response(status_code=204)

    return app


def unpack(upload: Path, size: int, staging: Path) -> None:
    """Unpack the uploaded tar into `staging`, refusing compression and members that add up to more than the
    upload (what a decompression bomb or a sparse member would need)."""
    with upload.open("rb") as f:
        if f.read(6).startswith(COMPRESSED):
            raise ValueError("a compressed tar is refused: send it uncompressed (as adapter_tar writes it)")
    with tarfile.open(upload, mode="r:") as tar:  # "r:": uncompressed only
        members = tar.getmembers()
        if len(members) > MAX_MEMBERS:
            raise ValueError(f"{len(members)} members, over {MAX_MEMBERS}")
        unpacked = sum(m.size for m in members)
        if unpacked > size or any(m.issparse() for m in members):
            raise ValueError(f"its members hold {unpacked} bytes, more than the {size}-byte upload")
        # The "data" filter refuses absolute paths, `..`, links out of the directory and device files.
        tar.extractall(staging, members=members, filter="data")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harnessrl adapter-store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, type=Path, help="directory shared with the engine")
    parser.add_argument("--token-file", required=True, type=Path, help="file holding the bearer token")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--body-timeout-seconds", type=float, default=UPLOAD_TIMEOUT_S,
                        help="an upload must be whole this long after its request's head")
    args = parser.parse_args(argv)
    try:
        token = args.token_file.read_text().strip()
    except OSError as exc:
        print(f"harnessrl adapter-store: cannot read the token file: {exc}", file=sys.stderr)
        return 2
    if not token:
        print(f"harnessrl adapter-store: the token file {args.token_file} is empty", file=sys.stderr)
        return 2
    logs.configure("INFO")
    # Built as every server is (runtime/serving.py), its body limits raised to an upload's.
    limits = ServerLimits(max_body_bytes=MAX_UPLOAD_BYTES, body_timeout_s=args.body_timeout_seconds)
    serving.server(create_app(args.dir, token), args.host, args.port, limits).run()
    return 0
