"""The normal API path (docs/gateway.md): the caller's own OIDC bearer, access level and
policy, platform-admin, the two catalogue layers evaluated for the caller (self-service)."""

from __future__ import annotations

from dataplane_contracts.catalogue import Binds
from dataplane_contracts.plans import Plan
from dataplane_service_kit.errors import ServiceError
from query_gateway.access_log import AccessContext
from query_gateway.clients.identity import Caller
from query_gateway.gateway import Gateway, QueryBody
from query_gateway.rules.layers import LayerRequest
from query_gateway.rules.policy import check_available, check_layers_declared, check_policy, needs_caller
from query_gateway.sql import NarrowedQuery

LAYERS: tuple[Binds, Binds] = ("person", "organization")


async def plan_normal(
    gw: Gateway, body: QueryBody, caller: Caller | None, ctx: AccessContext
) -> NarrowedQuery:
    """Everything up to the rewritten statement; every refusal is raised before any handler runs.
    Authentication comes first: without a bearer, when no dataset admits an anonymous caller,
    the answer is 401 whatever the statement says."""
    if caller is None and not gw.anonymous_readable:
        raise ServiceError(
            "auth_required", "authentication required: no dataset is open to anonymous callers"
        )
    q = await gw.validate_async(body, ctx)
    entries = [gw.entries[d] for d in q.dataset_ids]
    for entry in entries:
        ctx.current = entry.id
        check_available(entry)
        if caller is None and needs_caller(entry):
            raise ServiceError("auth_required", f"Dataset {entry.id} requires authentication")
        if caller is not None:
            check_policy(entry, caller)
        if caller is None or not caller.platform_admin:
            check_layers_declared(entry)
    ctx.current = None
    # GS-14: after the policy (a refused caller takes no token), before any plan is resolved
    # (a token without `sub` is its client's); every anonymous caller shares one bucket
    await gw.admit("sub", (caller.sub or caller.client_id) if caller is not None else None, q.dataset_ids)
    plans: dict[str, list[Plan]] = {}
    identity = caller.identity() if caller is not None else None
    for entry in entries:
        ctx.current = entry.id
        if caller is not None and caller.platform_admin:
            plans[entry.id] = []  # docs/gateway.md: the platform-admin realm role skips row filters
            continue
        layer_plans = []
        for layer in LAYERS:
            spec = getattr(entry.row_filters, layer)
            assert spec is not None  # check_layers_declared
            req = LayerRequest(dataset_id=entry.id, handler=spec.handler, args=spec.args, caller=caller)
            layer_plans.append(await gw.layer_plan(entry, layer, req, ctx, identity=identity))
        plans[entry.id] = layer_plans
    ctx.current = None
    return await gw.narrow(q, plans)


async def run_normal(
    gw: Gateway, body: QueryBody, caller: Caller | None, ctx: AccessContext
) -> dict[str, object]:
    from query_gateway.gateway import page_body

    narrowed = await plan_normal(gw, body, caller, ctx)
    page = await gw.execute(narrowed, body, dataspace=False)
    ctx.succeeded()
    return page_body(page)


async def explain_normal(
    gw: Gateway, body: QueryBody, caller: Caller | None, ctx: AccessContext
) -> dict[str, object]:
    """`POST /query/plan`: the rewritten statement with each parameter labelled, never its values."""
    narrowed = await plan_normal(gw, body, caller, ctx)
    ctx.succeeded()
    return {
        "sql": narrowed.sql,
        "params": [{"param": f"${i}", "label": label} for i, label in enumerate(narrowed.param_labels, 1)],
        "denied": narrowed.denied,
        "exposure": {d.dataset_id: d.as_json() for d in narrowed.exposure},  # names and masks only
    }
