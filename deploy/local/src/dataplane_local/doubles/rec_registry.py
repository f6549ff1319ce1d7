"""DEVELOPMENT DOUBLE of the REC registry (celine-eu/rec-registry), never deployed.

- `GET  /user/assets[?asset_type=]` (caller bearer) → `200 {"items": [...], "total": n}`, sorted by
  key; a caller that is no member → `403 {"detail": "You are not a member of any community",
  "code": "not_a_member"}`; no or unreadable bearer → 401.
- `POST /admin/lookup/assets-by-user-ids` `{"user_ids": [...]}` → a list of assets with their owner
  (`owner_user_id`, `owner_key`, `community_key`, ...); unknown ids contribute nothing; > 500 ids → 422.
- `GET /_calls`, `POST /_control` → test controls (faults with any status and JSON or text body).

Configuration (YAML or dict; `deploy/local/rec-registry.yaml` is an example)::

    members:
      alice:                          # looked up by the token's preferred_username
        user_id: u-alice              # what /admin/lookup matches (default: the username)
        key: member-alice             # owner_key (default: the username)
        community_key: rec-demo
        community_name: Demo REC
        assets:
          - {key: a1, asset_type: meter, name: Meter 1, sensor_id: POD-1, properties: {}, ...}
    jwks_url: http://...              # optional: verify caller bearers (else decoded unverified)
    audience: ...                     # optional, with jwks_url
    admin_required_scope: rec-registry.lookup   # optional, with jwks_url: scope of the lookup caller
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from dataplane_local.doubles._common import (
    Call,
    DoubleBase,
    JwksVerifier,
    add_common_routes,
    apply_fault,
    bearer_of,
    common_control,
    read_json,
    run_main,
    unverified_claims,
)

NOT_A_MEMBER = {"detail": "You are not a member of any community", "code": "not_a_member"}
MAX_LOOKUP_IDS = 500
_ASSET_FIELDS = ("key", "asset_type", "name", "sensor_id", "properties", "device", "relationships")
_CONFIG_KEYS = {"members", "jwks_url", "audience", "admin_required_scope"}


class RecRegistryDouble(DoubleBase):
    """State of the REC registry double; `create_app(state)` serves it over HTTP."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.members: dict[str, dict[str, Any]] = {}
        self._verifier: JwksVerifier | None = None
        self.admin_required_scope: str | None = None
        self.configure(config or {})

    def configure(self, config: dict[str, Any]) -> None:
        unknown = set(config) - _CONFIG_KEYS
        if unknown:
            raise ValueError(f"unknown rec registry config keys: {sorted(unknown)}")
        with self._lock:
            self.members = copy.deepcopy(config.get("members") or {})
        url = config.get("jwks_url")
        self._verifier = JwksVerifier(url, config.get("audience")) if url else None
        self.admin_required_scope = config.get("admin_required_scope")

    def set_member(self, username: str, assets: list[dict[str, Any]], **fields: Any) -> None:
        with self._lock:
            self.members[username] = {**fields, "assets": copy.deepcopy(assets)}

    def remove_member(self, username: str) -> None:
        with self._lock:
            self.members.pop(username, None)

    def assets_of(self, username: str, asset_type: str | None = None) -> list[dict[str, Any]] | None:
        with self._lock:
            member = self.members.get(username)
            if member is None:
                return None
            items = [_asset(a) for a in member.get("assets") or []]
        if asset_type is not None:
            items = [a for a in items if a["asset_type"] == asset_type]
        return sorted(items, key=lambda a: str(a["key"]))

    def lookup(self, user_ids: list[str]) -> list[dict[str, Any]]:
        wanted = set(user_ids)
        out: list[dict[str, Any]] = []
        with self._lock:
            for username, member in self.members.items():
                user_id = member.get("user_id", username)
                if user_id not in wanted:
                    continue
                for index, raw in enumerate(member.get("assets") or []):
                    asset = _asset(raw)
                    out.append(
                        {
                            "id": raw.get("id", f"{username}-{index}"),
                            **asset,
                            "owner_key": member.get("key", username),
                            "owner_user_id": user_id,
                            "community_key": member.get("community_key", "rec-demo"),
                            "community_name": member.get("community_name", "Demo REC"),
                        }
                    )
        return sorted(out, key=lambda a: (str(a["owner_user_id"]), str(a["key"])))

    def claims_of(self, token: str) -> dict[str, Any]:
        if self._verifier is not None:
            return self._verifier.verify(token)
        return unverified_claims(token)

    def control(self, body: dict[str, Any]) -> Any:
        handled, result = common_control(self, body)
        if handled:
            return result
        action = body["action"]
        if action == "config":
            self.configure(body["config"])
            return None
        if action == "set_member":
            extra = {k: v for k, v in body.items() if k not in {"action", "username", "assets"}}
            self.set_member(body["username"], body.get("assets") or [], **extra)
            return None
        if action == "remove_member":
            self.remove_member(body["username"])
            return None
        if action == "reset":
            self.clear_faults()
            self.clear_calls()
            return None
        raise ValueError(f"unknown action {action!r}")


def _asset(raw: dict[str, Any]) -> dict[str, Any]:
    asset = {f: copy.deepcopy(raw.get(f)) for f in _ASSET_FIELDS}
    for f in ("properties", "device", "relationships"):
        if asset[f] is None:
            asset[f] = {}
    asset["asset_type"] = asset["asset_type"] or "meter"
    asset["name"] = asset["name"] or asset["key"]
    return asset


def create_app(state: RecRegistryDouble) -> FastAPI:
    app = FastAPI(title="REC registry DEVELOPMENT DOUBLE")
    app.state.double = state

    async def recorded(request: Request, endpoint: str, body: Any, response: Response) -> Response:
        state.record(
            Call(
                endpoint,
                "",
                request.method,
                request.url.path,
                {k.lower(): v for k, v in request.headers.items()},
                body,
                response.status_code,
            )
        )
        return response

    def caller(request: Request) -> dict[str, Any] | Response:
        token = bearer_of(request)
        if token is None:
            return JSONResponse({"detail": "Not authenticated"}, status_code=401)
        try:
            return state.claims_of(token)
        except Exception:
            return JSONResponse({"detail": "Invalid token"}, status_code=401)

    @app.get("/user/assets")
    async def user_assets(request: Request, asset_type: str | None = None) -> Response:
        faulted = await apply_fault(state.take_fault("user_assets"))
        if faulted is not None:
            return await recorded(request, "user_assets", None, faulted)
        claims = caller(request)
        if isinstance(claims, Response):
            return await recorded(request, "user_assets", None, claims)
        username = claims.get("preferred_username")
        items = state.assets_of(username, asset_type) if isinstance(username, str) else None
        if items is None:
            return await recorded(request, "user_assets", None, JSONResponse(NOT_A_MEMBER, status_code=403))
        answer = JSONResponse({"items": items, "total": len(items)})
        return await recorded(request, "user_assets", None, answer)

    @app.post("/admin/lookup/assets-by-user-ids")
    async def lookup(request: Request) -> Response:
        body = await read_json(request)
        faulted = await apply_fault(state.take_fault("admin_lookup"))
        if faulted is not None:
            return await recorded(request, "admin_lookup", body, faulted)
        claims = caller(request)
        if isinstance(claims, Response):
            return await recorded(request, "admin_lookup", body, claims)
        scope = state.admin_required_scope
        if scope and scope not in str(claims.get("scope", "")).split():
            refused = JSONResponse({"detail": "Forbidden", "code": "forbidden"}, status_code=403)
            return await recorded(request, "admin_lookup", body, refused)
        ids = body.get("user_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or len(ids) > MAX_LOOKUP_IDS:
            invalid = JSONResponse(
                {"detail": f"user_ids: a list of at most {MAX_LOOKUP_IDS} strings"}, status_code=422
            )
            return await recorded(request, "admin_lookup", body, invalid)
        return await recorded(request, "admin_lookup", body, JSONResponse(state.lookup(ids)))

    add_common_routes(app, state, state.control)
    return app


def build(config: dict[str, Any]) -> FastAPI:
    return create_app(RecRegistryDouble(config))


def main(argv: list[str] | None = None) -> None:
    run_main("rec_registry", build, argv)


if __name__ == "__main__":
    main()
