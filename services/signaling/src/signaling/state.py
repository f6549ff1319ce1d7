"""What the lifespan builds and the routes use (typed, one object on `app.state.signaling`)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from aiokafka import AIOKafkaProducer
from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncEngine

from signaling.callback_relay import CallbackRelay
from signaling.callbacks import ControlPlaneClient
from signaling.flows import FlowService
from signaling.metrics import FlowGauge, Metrics
from signaling.oidc import JwtVerifier
from signaling.outbox import OutboxRelay
from signaling.renewal import TokenRenewal
from signaling.settings import Settings


@dataclass
class Dps:
    flows: FlowService
    verifier: JwtVerifier
    control_planes: ControlPlaneClient
    admitted: frozenset[str]
    renewal: TokenRenewal
    callbacks: CallbackRelay


@dataclass
class AppState:
    settings: Settings
    engine: AsyncEngine
    http: httpx.AsyncClient
    producer: AIOKafkaProducer
    relay: OutboxRelay | None
    metrics: Metrics  # this app's registry, the one its /metrics serves
    flow_gauge: FlowGauge
    dps: Dps | None


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.signaling
    return state


def dps_state(request: Request) -> Dps:
    dps = app_state(request).dps
    assert dps is not None, "DPS routes are only mounted when DPS is enabled"
    return dps
