"""Per-tenant prefix caches on the real engine: with two keys, a tenant's repeated prompt reads its own
cached blocks, and the same prompt from the other tenant reads none of them (so `cached_tokens` tells
no tenant what another has sent)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from bench.servers import start_server
from server.cluster.server_process import ServerProcess

pytestmark = pytest.mark.engine

KEYS = {"alice": "alice-secret-key", "bob": "bob-secret-key"}
# Several whole 32-token KV blocks, so a repeat can be served from the cache.
PROMPT = "The vault code of the lab is QX-7731; the backup code is ZR-1180. " * 12


@pytest.fixture(scope="module")
def two_tenant_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("tenant-cache")
    keys = root / "keys"
    keys.write_text("".join(f"{name}:{key}\n" for name, key in KEYS.items()))
    keys.chmod(0o600)
    server = start_server(root / "xdb", lens="off", extra=["--api-keys-file", str(keys)])
    yield server
    server.stop()


def cached_tokens(server: ServerProcess, tenant: str, **extra: object) -> int:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEYS[tenant], timeout=120)
    reply = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=2, temperature=0,
                                           messages=[{"role": "user", "content": PROMPT}], extra_body=extra)
    assert reply.usage is not None and reply.usage.prompt_tokens > 96
    details = reply.usage.prompt_tokens_details
    return details.cached_tokens if details is not None and details.cached_tokens else 0


def test_a_tenant_reads_its_own_cached_prefix_and_never_another_tenants(two_tenant_server: ServerProcess) -> None:
    assert cached_tokens(two_tenant_server, "alice") == 0
    assert cached_tokens(two_tenant_server, "alice") >= 96  # her own blocks
    assert cached_tokens(two_tenant_server, "bob") == 0  # the same prompt, Alice's blocks unseen
    # A salt Bob picks is replaced by his tenant's: he reads his own blocks, and only his.
    assert cached_tokens(two_tenant_server, "bob", cache_salt="alice") >= 96

