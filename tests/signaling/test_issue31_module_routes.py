"""Issue 31: signaling's handlers are module-level functions on module-level routers, with what
they need of the lifespan's state declared as dependencies; two apps of one process share no
state through them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.routing import APIRoute

from dataplane_testing.metrics import sample, scrape
from dataplane_testing.signaling import auth, run_app
from signaling import routes
from signaling.app import create_app
from signaling.settings import Settings


def _endpoints(router: Any) -> list[Callable[..., Any]]:
    """Every route function an app serves, through included routers (which FastAPI may hold by
    reference, `original_router`, or as copied routes)."""
    found: list[Callable[..., Any]] = []
    for route in router.routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            found += _endpoints(inner)
        elif isinstance(route, APIRoute):
            found.append(route.endpoint)
    return found


def test_issue31_every_dps_route_is_a_module_level_function(base_settings: dict[str, Any]) -> None:
    app = create_app(Settings(**base_settings))
    served = [e for e in _endpoints(app.router) if e.__module__ == routes.__name__]
    assert len(served) == 12  # the registration, two control-plane, eight flow routes, the renewal
    for endpoint in served:
        assert "<locals>" not in endpoint.__qualname__, endpoint.__qualname__
        assert getattr(routes, endpoint.__name__) is endpoint, endpoint.__name__


async def test_issue31_two_apps_count_their_own_signals(base_settings: dict[str, Any], cp_token: Any) -> None:
    async with run_app(base_settings) as first, run_app(base_settings) as second:
        answer = await first.client.get("/dps/registration", headers=auth(cp_token()))
        assert answer.status_code == 200, answer.text
        name = "signaling_signals_total"
        assert sample(await scrape(first.client), name, signal="registration", outcome="ok") == 1
        assert sample(await scrape(second.client), name, signal="registration", outcome="ok") == 0
