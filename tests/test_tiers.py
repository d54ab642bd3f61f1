"""Every collected test has exactly one tier, and the tiers are registered markers under
``--strict-markers`` (``pyproject.toml``; assigned in ``tests/conftest.py``)."""

TIERS = ("unit", "integration")


def test_every_collected_test_has_exactly_one_tier(request):
    items = request.session.items
    assert request.node in items
    for item in items:
        tiers = [m.name for m in item.iter_markers() if m.name in TIERS]
        assert len(tiers) == 1, (item.nodeid, tiers)


def test_the_tiers_are_registered_and_markers_strict(request):
    config = request.config
    registered = {line.split(":")[0].strip() for line in config.getini("markers")}
    assert set(TIERS) <= registered
    assert "--strict-markers" in config.getini("addopts")
