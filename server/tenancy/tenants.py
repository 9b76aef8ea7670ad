"""Tenants: each API key is a tenant, and a tenant sees only what it created.

Isolation is by namespace. Every id a client names (a session, a run, a document) is stored as the
tenant's prefix followed by the id, and handed back without it; a lookup of another tenant's id reads
a key that cannot exist, so it is a 404 with nothing to compare. Listings without an id (recall
without a session, the documents list) are filtered by the prefix, and rows reached by a global id
(a timestep id, a request id) are checked against it.

The tenant named `default` has an empty prefix: a local server without a key, or one with a single
key, stores ids as the client sent them. With several keys, each tenant has its own prefix: a key
given bare is named after its hash (`key-` and 12 hex digits), a keys file names them (`tenant:key`
a line). To keep the data a single-key server stored when adding a second key, name the first key's
tenant `default` in the keys file.

Among other tenants, `default` is a tenant like the others, not a superuser: it owns exactly the ids
without a "/" (any id with one may be another tenant's), and an id it names with a "/" is refused
(it would be another tenant's id). Every filter of the data layer takes the tenant's `owner` for this
(xdb/owner.py), so no listing, lookup by name or SHA-256, export or recall reaches past it.

The operator: the `default` tenant alone may use what spans every tenant's rows without reading them
(compressing every released row, resolving evidence submissions on the shared buds).

An auditor (a keys-file line `auditor NAME:KEY`) is no tenant: it owns nothing, reads the audit log
(`/v1/audit/...`) and nothing else, and no other key reads the audit log.

The prefix cache is isolated the same way: with several tenants every engine request carries its
tenant's `cache_salt` (an HMAC of the tenant's name under a secret made at start; a client's own salt
is replaced), so a tenant's `cached_tokens` never tell it what another tenant's prompts hold. With one
tenant the cache is shared and a client's salt is its own.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InvalidRequest
from xdb.owner import FLAT, owns

log = logging.getLogger("ahc.tenants")

DEFAULT = "default"
# The separator cannot occur in a tenant name, so one tenant's prefix never starts another's.
SEPARATOR = "/"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Tenant:
    name: str
    among_others: bool = False  # the server has other tenants
    auditor: bool = False  # reads the audit log, and nothing else

    @property
    def prefix(self) -> str:
        """What this tenant's stored ids start with."""
        return "" if self.name == DEFAULT else self.name + SEPARATOR

    @property
    def owner(self) -> str:
        """Which stored ids are this tenant's, for the data layer's filters (xdb/owner.py)."""
        return FLAT if self.name == DEFAULT and self.among_others else self.prefix

    @property
    def operator(self) -> bool:
        return self.name == DEFAULT and not self.auditor

    def scope(self, local_id: str) -> str:
        """The stored id of one of this tenant's ids."""
        if self.owner == FLAT and SEPARATOR in local_id:
            raise InvalidRequest(f"id {local_id[:80]!r}: with several tenants, the default tenant's ids may not "
                                 f"contain {SEPARATOR!r} (such an id is another tenant's)")
        return self.prefix + local_id

    def scope_opt(self, local_id: str | None) -> str | None:
        return None if local_id is None else self.scope(local_id)

    def owns(self, stored_id: str | None) -> bool:
        return owns(self.owner, stored_id)

    def unscope(self, stored_id: str) -> str:
        """The id as this tenant named it. Only ever called on ids the tenant owns."""
        if not self.owns(stored_id):
            raise ValueError(f"tenant {self.name!r} does not own {stored_id!r}")
        return stored_id[len(self.prefix):]

    def unscope_rows(self, rows: Iterable[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
        """Rows with the named id fields handed back as the tenant named them."""
        out = []
        for row in rows:
            row = dict(row)
            for key in keys:
                if isinstance(row.get(key), str):
                    row[key] = self.unscope(row[key])
            out.append(row)
        return out


LOCAL = Tenant(DEFAULT)


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class TenantKeys:
    """The server's keys, by SHA-256 digest (a key is never kept or compared in the clear)."""

    by_digest: Mapping[bytes, Tenant]  # auditors included
    # Salts differ from one start to the next: the prefix cache does not outlive the process either.
    salt_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False, compare=False)

    def tenant_for(self, key: str) -> Tenant | None:
        return self.by_digest.get(key_digest(key))

    def cache_salt(self, tenant: Tenant) -> str | None:
        """The prefix-cache salt of `tenant`'s engine requests; None with a single tenant (or none)."""
        return self._salt(tenant.name)

    def system_salt(self) -> str | None:
        """The salt of the server's own calls over many tenants' rows (the storage pass's summaries):
        no tenant's, since no tenant name holds the separator."""
        return self._salt(SEPARATOR + "system")

    def _salt(self, name: str) -> str | None:
        if sum(not t.auditor for t in self.by_digest.values()) < 2:
            return None
        return hmac.new(self.salt_secret, name.encode(), hashlib.sha256).hexdigest()

    def __bool__(self) -> bool:
        return bool(self.by_digest)

    @property
    def tenants(self) -> set[str]:
        """The tenants' names (auditors are none)."""
        return {t.name for t in self.by_digest.values() if not t.auditor}

    @classmethod
    def build(cls, keys: Iterable[str], keys_file: str | Path | None = None) -> TenantKeys:
        """Bare keys (a single one is the `default` tenant, several are named by hash) and a keys file
        of `tenant:key` lines, or `auditor name:key` for an auditor (`#` comments and blank lines
        ignored). Raises ValueError naming the problem: an empty key, a bad name, a key given twice, a
        name with two keys."""
        bare = list(keys)
        lines = parse_keys_file(Path(keys_file)) if keys_file is not None else []
        named = [(name, key) for name, key, auditor in lines if not auditor]
        auditors = [(name, key) for name, key, auditor in lines if auditor]
        if keys_file is not None and Path(keys_file).stat().st_mode & 0o077:
            log.warning("the API keys file %s can be read by other users (mode %o): chmod 600 it", keys_file,
                        Path(keys_file).stat().st_mode & 0o777)
        pairs: list[tuple[str, str]] = []
        for key in bare:
            if not key:
                raise ValueError("--api-key: a key must not be empty")
            name = DEFAULT if len(bare) == 1 and not named else "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]
            pairs.append((name, key))
        pairs += named
        by_digest: dict[bytes, Tenant] = {}
        names: set[str] = set()
        among_others = len(pairs) > 1
        for name, key, auditor in [(n, k, False) for n, k in pairs] + [(n, k, True) for n, k in auditors]:
            digest = key_digest(key)
            if digest in by_digest:
                raise ValueError(f"api keys: the same key is given twice ({by_digest[digest].name!r} "
                                 f"and {name!r})")
            if name in names:
                raise ValueError(f"api keys: {name!r} has more than one key")
            names.add(name)
            by_digest[digest] = Tenant(name, among_others, auditor)
        return cls(by_digest)


def parse_keys_file(path: Path) -> list[tuple[str, str, bool]]:
    """(name, key, is an auditor) for each key line."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"api keys file {str(path)!r}: {exc.strerror or exc}") from None
    pairs = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, key = line.partition(":")
        name, key = name.strip(), key.strip()
        role, _, named = name.partition(" ")
        auditor = role == "auditor" and bool(named.strip())
        name = named.strip() if auditor else name
        if not sep or not key:
            raise ValueError(f"api keys file {str(path)!r} line {number}: expected 'tenant:key' or "
                             "'auditor name:key'")
        if not _NAME.fullmatch(name):
            raise ValueError(f"api keys file {str(path)!r} line {number}: bad tenant name {name!r} "
                             "(letters, digits, '_', '.', '-'; at most 64)")
        pairs.append((name, key, auditor))
    if not pairs:
        raise ValueError(f"api keys file {str(path)!r} names no key")
    return pairs


def check_tenancy(keys: TenantKeys) -> None:
    """vLLM's stored Responses (`VLLM_ENABLE_RESPONSES_API_STORE`) are kept by response id for anyone
    who asks: with several tenants, one could read another's. Refuse the combination."""

    tenants = keys.tenants
    if len(tenants) > 1 and os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE", "0") not in ("", "0"):
        raise ValueError("VLLM_ENABLE_RESPONSES_API_STORE keeps responses readable by any key: unset it to serve "
                         f"several tenants ({len(tenants)} configured)")


def serving_keys(api_key: Iterable[str], api_keys_file: str | Path | None) -> TenantKeys:
    """The keys a server starts with, checked: a bad keys file or a refused combination fails before the
    engine is imported or the model loads."""
    keys = TenantKeys.build(api_key, api_keys_file)
    check_tenancy(keys)
    return keys
