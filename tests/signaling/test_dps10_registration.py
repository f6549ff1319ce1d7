"""DPS-10 — the registration message."""

from __future__ import annotations

from typing import Any

from dataplane_testing.signaling import auth, run_app


async def test_dps10_the_registration_message_is_edc_shaped(signaling: Any, cp_token: Any) -> None:
    r = await signaling.client.get("/dps/registration", headers=auth(cp_token()))
    assert r.status_code == 200
    assert r.json() == {
        "dataplaneId": "dataset-api",
        "endpoint": "https://signaling.example/dps/v1/dataflows",
        "transferTypes": ["HttpData-PULL"],
        "labels": [],
        "profiles": ["HttpData-PULL"],  # RC3's name for the same list
    }


async def test_dps10_registration_follows_configuration(base_settings: dict[str, Any], cp_token: Any) -> None:
    values = {
        **base_settings,
        "dps_dataplane_id": "dp-7",
        "dps_signaling_url": "https://sig.example/",
        "dps_transfer_types": ["HttpData-PULL", "https://w3id.org/dspace-sig/profile/http-pull"],
        "dps_labels": ["eu", "sql"],
    }
    async with run_app(values) as app:
        r = await app.client.get("/dps/registration", headers=auth(cp_token()))
        assert r.json() == {
            "dataplaneId": "dp-7",
            "endpoint": "https://sig.example/dps/v1/dataflows",
            "transferTypes": ["HttpData-PULL", "https://w3id.org/dspace-sig/profile/http-pull"],
            "labels": ["eu", "sql"],
            "profiles": ["HttpData-PULL", "https://w3id.org/dspace-sig/profile/http-pull"],
        }
        assert "authorization" not in r.text
