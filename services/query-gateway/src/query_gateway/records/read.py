"""The dataspace read under every records answer, a page or a change session: the pull's
dataspace request, the dataset's whole statement validated, and the same narrowing as
`POST /dps/public/query` — ds asked (or its decision reused within its ttl), both layers."""

from __future__ import annotations

from dataclasses import dataclass

from query_gateway.access_log import AccessContext
from query_gateway.clients.pull import VerifiedPull
from query_gateway.deps import pull_request
from query_gateway.pipeline import Granted, read_dataset
from query_gateway.rules.verdicts import DataspaceRequest
from query_gateway.state import Gateway


@dataclass(frozen=True)
class Headers:
    authorization: str | None
    agreement: str | None
    transfer: str | None
    purpose: str | None


async def dataspace_read(
    gw: Gateway, grant: VerifiedPull, h: Headers, ctx: AccessContext
) -> tuple[DataspaceRequest, Granted]:
    req = pull_request(gw, grant, h.transfer, h.purpose)
    # fenced: a change session's conditions and join sit above the narrowed statement, as a
    # records page's do (docs/gateway.md QE-12)
    return req, await read_dataset(gw, grant.dataset_id, req, ctx, fenced=True)
