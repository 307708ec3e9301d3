"""AIBrix L2 keys (bytes) -> EIC key strings, and back for diagnostics.

Format: ``e2.<ns>.<conn>.<model>.<kind><payload>``

- ``e2``: format version, so a future format can never alias this one (e1
  keys had no model field; an upgrade turns them into misses).
- ``<ns>``, ``<conn>``, ``<model>``: the EIC namespace, AIBrix's connector id
  (``{namespace}_{partition}_{signatures}``) and the model identity
  (keys/identity.py; empty when nothing identifies the model), escaped so they
  never contain ``.``: bytes outside ``[A-Za-z0-9_-]`` become ``~HH``. A field
  whose escaped form is longer than FIELD_MAX becomes ``~h`` + 32 hex digits
  of its BLAKE2b-128 digest, which keeps the length bounded.
- ``<kind><payload>``: ``r`` + hex of the key when it is at most RAW_MAX
  bytes (AIBrix's default ROLLING_HASH keys are 16 bytes), which is exactly
  reversible; otherwise ``h`` + hex of its BLAKE2b-256 digest (RAW keys and
  vLLM block-hash keys can be kilobytes).

Distinct (ns, conn, model) triples give distinct prefixes because escaping
is injective and ``.`` separates the fields, so partitions, namespaces and
models can only collide through a BLAKE2b collision of an over-long field.
Keys use only ``[A-Za-z0-9_~.-]`` and are at most MAX_KEY_LEN characters.

vLLM's secondary tier (aibrix_eic/tier/) stores a chunk of vLLM's CPU
offload layout, not AIBrix's block layout, so its keys must never be read by
an AIBrix connector or the other way round: `tier_codec` puts ``~t`` and a
layout digest in the conn field. An escaped field never starts with ``~t``
(escape_field writes ``~`` only before two hex digits or ``h``), so no tier
key equals any AIBrix key, whatever the conn_id.
"""

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

VERSION = "e2"
FIELD_MAX = 64
RAW_MAX = 32
KEY_DIGEST_BYTES = 32
FIELD_DIGEST_BYTES = 16
FIELDS = 3  # namespace, conn_id, model identity
MAX_KEY_LEN = len(VERSION) + FIELDS + 1 + FIELDS * FIELD_MAX + 1 + 2 * max(RAW_MAX, KEY_DIGEST_BYTES)
SAFE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-~.")

_UNESCAPED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPE = re.compile(r"~([0-9a-f]{2})")


def escape_field(text: str) -> str:
    """Injective escape of text into [A-Za-z0-9_~-], bounded in length."""
    escaped = "".join(chr(b) if b in _UNESCAPED else f"~{b:02x}" for b in text.encode("utf-8"))
    if len(escaped) <= FIELD_MAX:
        return escaped
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=FIELD_DIGEST_BYTES)
    return "~h" + digest.hexdigest()


def unescape_field(field: str) -> str | None:
    """The text behind an escaped field; None when it was replaced by a digest."""
    if field.startswith("~h"):
        return None
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), field).encode("latin-1").decode("utf-8")


@dataclass(frozen=True)
class KeyParts:
    """What decode() recovers from an EIC key string."""

    version: str
    namespace: str | None  # None when the field was digested
    conn_id: str | None  # None when the field was digested
    identity: str | None  # the model identity token ("" for none); None when digested
    key: bytes | None  # the AIBrix key, when stored raw
    key_digest: bytes | None  # BLAKE2b-256 of the AIBrix key, when hashed


class KeyCodec:
    """Encodes the keys of one connector: one conn_id, one namespace, one
    model identity. The fields are escaped once, here, into `prefix`."""

    def __init__(self, conn_id: str, namespace: str = "", identity: str = "", *, conn_field: str | None = None) -> None:
        self.conn_id = conn_id
        self.namespace = namespace
        self.identity = identity
        conn = escape_field(conn_id) if conn_field is None else conn_field
        self.prefix = f"{VERSION}.{escape_field(namespace)}.{conn}.{escape_field(identity)}."

    def encode(self, key: bytes) -> str:
        if len(key) <= RAW_MAX:
            return self.prefix + "r" + key.hex()
        return self.prefix + "h" + hashlib.blake2b(key, digest_size=KEY_DIGEST_BYTES).hexdigest()

    def encode_many(self, keys: Sequence[bytes]) -> list[str]:
        prefix_raw, prefix_hashed = self.prefix + "r", self.prefix + "h"
        blake2b = hashlib.blake2b
        return [
            prefix_raw + key.hex()
            if len(key) <= RAW_MAX
            else prefix_hashed + blake2b(key, digest_size=KEY_DIGEST_BYTES).hexdigest()
            for key in keys
        ]


TIER_MARK = "~t"  # no escaped field starts with it: see the module docstring
LAYOUT_DIGEST_BYTES = 12


def tier_codec(namespace: str, identity: str, layout: str) -> KeyCodec:
    """The codec of vLLM's secondary tier: keys disjoint from every AIBrix
    connector's (the conn field is TIER_MARK + a digest of `layout`, the
    text naming the chunk's byte layout), shared by every replica whose
    namespace, model identity and layout agree."""
    digest = hashlib.blake2b(layout.encode("utf-8"), digest_size=LAYOUT_DIGEST_BYTES).hexdigest()
    return KeyCodec(f"vllm-tier:{layout}", namespace, identity, conn_field=TIER_MARK + digest)


def decode(eic_key: str) -> KeyParts:
    """Split an EIC key made by KeyCodec into its parts.

    Raises ValueError for strings this codec did not make.
    """
    parts = eic_key.split(".")
    if len(parts) != 2 + FIELDS or parts[0] != VERSION or not parts[-1]:
        raise ValueError(f"not an aibrix_eic {VERSION} key: {eic_key!r}")
    _, ns_field, conn_field, identity_field, payload = parts
    kind, body = payload[0], payload[1:]
    try:
        data = bytes.fromhex(body)
    except ValueError:
        raise ValueError(f"key payload is not hex: {eic_key!r}") from None
    if kind == "r" and len(data) <= RAW_MAX:
        key, digest = data, None
    elif kind == "h" and len(data) == KEY_DIGEST_BYTES:
        key, digest = None, data
    else:
        raise ValueError(f"unknown key payload kind in {eic_key!r}")
    return KeyParts(
        version=VERSION,
        namespace=unescape_field(ns_field),
        conn_id=unescape_field(conn_field),
        identity=unescape_field(identity_field),
        key=key,
        key_digest=digest,
    )


def hash_key(key: bytes) -> bytes:
    """The digest stored for keys longer than RAW_MAX bytes."""
    return hashlib.blake2b(key, digest_size=KEY_DIGEST_BYTES).digest()
