"""The one bounded memo (dataplane_service_kit.bounded_cache): at most `maxsize` entries, the least
recently used out first, a membership test not counting as a use."""

from __future__ import annotations

import pytest

from dataplane_service_kit.bounded_cache import BoundedCache


def test_the_least_recently_used_goes_first() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a used: b is now the oldest
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (1, None, 3, 2)


def test_a_membership_test_is_not_a_use_and_pop_forgets() -> None:
    cache: BoundedCache[str, bool] = BoundedCache(2)
    cache.put("a", True)
    cache.put("b", True)
    assert "a" in cache
    cache.put("c", True)  # a was only looked at: it is the oldest still
    assert ("a" in cache, "b" in cache, "c" in cache) == (False, True, True)
    cache.pop("b")
    cache.pop("never")
    assert len(cache) == 1


def test_a_cache_holds_at_least_one() -> None:
    with pytest.raises(ValueError):
        BoundedCache(0)
