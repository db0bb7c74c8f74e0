"""The engine pod's adapter store: where the learner uploads each LoRA adapter before vLLM loads it.

`POST /v1/load_lora_adapter` takes a path on the engine's own filesystem. On one machine that is the learner's
sync directory; in a cluster the learner's checkpoint volume is mounted in the learner Pod only (ReadWriteOnce,
often on another node), so a small sidecar in each engine Pod receives the adapter over HTTP into a volume it
shares with vLLM, and the learner then loads it from there:

    PUT    /adapters/{name}   body: a tar of the adapter directory  -> StoredAdapter (the path vLLM can read)
    DELETE /adapters/{name}                                          -> 204
    GET    /healthz

Writes need `Authorization: Bearer <token>` (the run's proxy admin token, a Secret the learner already holds).
An upload lands in a temporary directory and is renamed into place, so vLLM never reads half an adapter.
"""

from __future__ import annotations

import argparse
import hmac
import io
import logging
import re
import shutil
import sys
import tarfile
from pathlib import Path

from fastapi import FastAPI, Header, HTTPException, Request, Response
from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MAX_UPLOAD_BYTES = 2 * 1024**3  # LoRA adapters are megabytes to a few hundred; the upload is held in memory


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

    def authorize(authorization: str | None) -> None:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(status_code=401, detail="a valid bearer token is required")

    def checked(name: str) -> str:
        if re.fullmatch(NAME_PATTERN, name) is None:
            raise HTTPException(status_code=422, detail=f"adapter name {name!r} must match {NAME_PATTERN}")
        return name

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.put("/adapters/{name}", response_model=StoredAdapter)
    async def put(name: str, request: Request, authorization: str | None = Header(None)) -> StoredAdapter:
        authorize(authorization)
        checked(name)
        if int(request.headers.get("content-length") or 0) > MAX_UPLOAD_BYTES:
            raise HTTPException(status_code=413, detail=f"adapter upload over {MAX_UPLOAD_BYTES} bytes")
        body = await request.body()
        if len(body) > MAX_UPLOAD_BYTES:
            raise HTTPException(status_code=413, detail=f"adapter upload over {MAX_UPLOAD_BYTES} bytes")
        staging, target = root / f".{name}.tmp", root / name
        shutil.rmtree(staging, ignore_errors=True)
        try:
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
                # The "data" filter refuses absolute paths, `..`, links out of the directory and device files.
                tar.extractall(staging, filter="data")
        except (tarfile.TarError, OSError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise HTTPException(status_code=400, detail=f"not a usable adapter tar: {exc}") from None
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        log.info("stored adapter %s (%d bytes)", name, len(body))
        return StoredAdapter(name=name, path=str(target.resolve()))

    @app.delete("/adapters/{name}", status_code=204)
    async def delete(name: str, authorization: str | None = Header(None)) -> Response:
        authorize(authorization)
        shutil.rmtree(root / checked(name), ignore_errors=True)
        return Response(status_code=204)

    return app


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harnessrl adapter-store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, type=Path, help="directory shared with the engine")
    parser.add_argument("--token-file", required=True, type=Path, help="file holding the bearer token")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args(argv)
    try:
        token = args.token_file.read_text().strip()
    except OSError as exc:
        print(f"harnessrl adapter-store: cannot read the token file: {exc}", file=sys.stderr)
        return 2
    if not token:
        print(f"harnessrl adapter-store: the token file {args.token_file} is empty", file=sys.stderr)
        return 2
    import uvicorn

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(args.dir, token), host=args.host, port=args.port, log_level="warning")
    return 0
