"""The one `Authorization` reader (dataplane_service_kit.authorization): `Bearer <token>` in any
case of the scheme, white space ignored; without the scheme a token only where it is optional."""

from __future__ import annotations

import pytest

from dataplane_service_kit.authorization import bearer


@pytest.mark.parametrize(
    ("header", "strict", "optional"),
    [
        (None, None, None),
        ("", None, None),
        ("Bearer abc", "abc", "abc"),
        ("  bearer   abc  ", "abc", "abc"),
        ("BEARER abc", "abc", "abc"),
        ("Bearer", None, None),
        ("Bearer   ", None, None),
        ("Basic abc", None, "Basic abc"),
        ("abc", None, "abc"),
        ("Bearerabc", None, "Bearerabc"),
    ],
)
def test_bearer(header: str | None, strict: str | None, optional: str | None) -> None:
    assert bearer(header) == strict
    assert bearer(header, scheme_optional=True) == optional
