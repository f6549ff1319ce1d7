"""Run the OIDC issuer DEVELOPMENT DOUBLE (`doubles/oidc.py`) as a process for the local stack:

    python -m dataplane_local.doubles.oidc_process --port N [--host H] [--config file.yaml]

Config: `clients: {client_id: secret}`, `default_audience`, `key_type` (EC | RSA). The issuer id
(`iss`, `CELINE_OIDC_BASE_URL`) is `http://{host}:{port}`.

Besides the issuer's own endpoints, a development-only `POST /_mint` `{"claims": {...},
"audience": "...", "expires_in": N}` → `{"token": "..."}` mints a user token (what `mint()` does in
process), so the demo and tests can act as a person, e.g. `{"claims": {"sub": "u-alice",
"preferred_username": "alice"}}`."""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import Request
from fastapi.responses import JSONResponse

from dataplane_local.doubles._common import load_config
from dataplane_local.doubles.oidc import OidcIssuer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="DEVELOPMENT DOUBLE: OIDC issuer. Never deploy it.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--config", default=None)
    args = parser.parse_args(argv)
    config = load_config(args.config)
    issuer = OidcIssuer(
        f"http://{args.host}:{args.port}",
        key_type=config.get("key_type", "EC"),
        clients=dict(config.get("clients") or {}),
        default_audience=config.get("default_audience"),
    )
    app = issuer.app()

    @app.post("/_mint")
    async def mint(request: Request) -> JSONResponse:
        body = await request.json()
        if not isinstance(body, dict):
            return JSONResponse({"detail": "body must be an object"}, status_code=422)
        token = issuer.mint(
            body.get("claims") or {}, audience=body.get("audience"), expires_in=body.get("expires_in")
        )
        return JSONResponse({"token": token})

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
