"""Issue 20 (hot path): a pure handler's plan is built once per reused ds verdict (RF-04's
plan of a hundred keys is not rebuilt per request while ds's decision is cached) and never
outlives what it was built from: another catalogue entry object, or a refusal, builds again."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from dataplane_contracts.catalogue import load_catalogue
from dataplane_contracts.ds import DatasetVerdict
from dataplane_contracts.plans import Plan
from dataplane_service_kit.errors import ServiceError
from query_gateway.rules.verdicts import Judged as _Judged
from query_gateway.rules.verdicts import _derived as _memo
from query_gateway.rules.verdicts import derived_plan as _derived_plan

CATALOGUE = Path(__file__).parent / "catalogue.yaml"


def _judged(verdict: DatasetVerdict) -> _Judged:
    entry = load_catalogue(CATALOGUE).by_id()["readings"]  # a new entry object each time
    return _Judged(entry, verdict, None)


def test_rf04_plan_built_once_per_verdict_and_entry() -> None:
    verdict = DatasetVerdict(dataset_id="readings", decision="allow")
    j = _judged(verdict)
    built: list[Plan] = []

    def build() -> Plan:
        built.append(Plan.among("pod", ["pod-1", "pod-2"], label="pod keys"))
        return built[-1]

    first = _derived_plan(j, "person", build)
    assert _derived_plan(j, "person", build) is first and len(built) == 1
    # each layer its own plan
    assert _derived_plan(j, "organization", build) is not first and len(built) == 2
    # the same verdict met with another entry object (a catalogue read again): built again
    again = _judged(verdict)
    assert _derived_plan(again, "person", build) is not first and len(built) == 3
    # another verdict (ds asked again): nothing carried over
    fresh = _judged(DatasetVerdict(dataset_id="readings", decision="allow"))
    assert _derived_plan(fresh, "person", build) is built[-1] and len(built) == 4


def test_rf04_refusal_is_not_kept() -> None:
    j = _judged(DatasetVerdict(dataset_id="readings", decision="allow"))
    calls = 0

    def refuse() -> Plan:
        nonlocal calls
        calls += 1
        raise ServiceError("row_filter_invalid", "row filter names no column")

    for _ in range(2):
        with pytest.raises(ServiceError):
            _derived_plan(j, "person", refuse)
    assert calls == 2
    # nothing was kept in its place: the first build that succeeds is the one kept
    plan = Plan.among("pod", ["pod-1"], label="pod keys")
    assert _derived_plan(j, "person", lambda: plan) is plan
    assert _derived_plan(j, "person", refuse) is plan and calls == 2


def test_issue31_a_derived_plan_goes_with_its_verdict() -> None:
    """The memo is the gateway's, beside the wire model: a verdict collected takes its plans."""
    verdict = DatasetVerdict(dataset_id="readings", decision="allow")
    j = _judged(verdict)
    _derived_plan(j, "person", lambda: Plan.among("pod", ["pod-1"], label="pod keys"))
    assert id(verdict) in _memo
    key = id(verdict)
    del j, verdict
    gc.collect()
    assert key not in _memo
