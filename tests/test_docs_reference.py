"""The documentation's reference pages cover the code: every configuration field (with a description), every
metric the server registers, every route it mounts and every command of `ahc` is on its generated page; and
`make docs`, which `make test` runs, builds the whole site with `mkdocs build --strict` (a broken link or a page
outside the nav fails it)."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from ahc import docs_reference
from core.config import AHCConfig


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return docs_reference.build_app()


def test_every_config_field_has_a_description_and_is_on_the_page() -> None:
    fields = list(docs_reference.config_fields(AHCConfig))
    assert len(fields) > 90  # every section was walked, not only the top level
    undescribed = [f.key for f in fields if len(f.description.split()) < 3]
    assert not undescribed, f"config fields without a description (give each a docstring): {undescribed}"
    page = docs_reference.configuration_page()
    missing = [f.key for f in fields if f"`{f.key}`" not in page or f"`{f.env}`" not in page]
    assert not missing, f"config fields missing from the configuration reference: {missing}"
    assert "`AHC_XDB__LAKE__CATALOG`" in page and "`AHC_ORCHESTRATOR__SESSION_HOT_S`" in page


def test_env_names_are_the_ones_the_config_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's variable for a nested field really sets it."""
    field = next(f for f in docs_reference.config_fields(AHCConfig) if f.key == "xdb.lake.ship_interval_s")
    monkeypatch.setenv(field.env, "7.5")
    assert AHCConfig().xdb.lake.ship_interval_s == 7.5


def test_every_metric_the_server_registers_is_on_the_page() -> None:
    from server.metrics import AHCMetrics

    families = list(AHCMetrics().registry.collect())
    assert len(families) > 30
    page = docs_reference.metrics_page()
    missing = [f.name for f in families if f"`{f.name}" not in page]
    assert not missing, f"metrics missing from the metrics reference: {missing}"
    assert all(f.documentation for f in families)
    assert "`ahc_prompt_tokens_total` | counter | `model_name`, `kind`" in page


def test_every_route_the_server_mounts_is_on_the_page(app: FastAPI) -> None:
    page = docs_reference.routes_page(app)
    paths = {docs_reference.public_path(getattr(route, "path", "")) for route in app.router.routes}
    assert {"/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/xdb/recall", "/health", "/metrics",
            "/ui/", "/v1/audit/records"} <= paths
    missing = sorted(p for p in paths if f"{p}`" not in page)
    assert not missing, f"routes missing from the HTTP reference: {missing}"
    for route in docs_reference.mounted_routes(app):
        for method in route.methods:
            assert f"`{method} {route.path}`" in page or f"| `{route.path}` | {', '.join(route.methods)}" in page


def test_removed_vllm_routes_are_not_served(app: FastAPI) -> None:
    from server.app import REMOVED_PATHS

    served = {route.path for route in docs_reference.mounted_routes(app)}
    assert not served & set(REMOVED_PATHS)


def test_every_cli_command_is_on_the_page() -> None:
    commands = docs_reference.cli_commands()
    words = {c.words for c in commands}
    assert {"ahc serve", "ahc cluster", "ahc xdb verify-audit", "ahc lens train", "ahc bench"} <= words
    undescribed = [c.words for c in commands if not c.help.strip()]
    assert not undescribed, f"commands without help: {undescribed}"
    page = docs_reference.cli_page()
    missing = [c.words for c in commands if f"`{c.words}`" not in page]
    missing += [f"{c.words} {p[0]}" for c in commands for p in c.params if f"`{p[0]}`" not in page]
    assert not missing, f"commands or options missing from the CLI reference: {missing}"
