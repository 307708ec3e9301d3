"""The namespace step of `aibrix-eic check`: a block written in our
namespace must be invisible from another one."""

import dataclasses
import os

from ..link.sdk import HIT, SdkClient
from .check_steps import PASS, CheckSteps, StepFailed, what_to_fix

OTHER_NAMESPACE_SUFFIX = "aibrix-eic-check"


class NamespaceSteps(CheckSteps):
    def check_namespace(self) -> tuple[str, str]:
        """A key written in our namespace is invisible from another one: the
        same EIC key string, asked for through a client whose options carry
        another namespace, must miss."""
        from ..keys.codec import KeyCodec

        config = self.cfg
        other_ns = f"{config.eic_kv_ns}-{OTHER_NAMESPACE_SUFFIX}" if config.eic_kv_ns else OTHER_NAMESPACE_SUFFIX
        key = os.urandom(16)
        self.cleanup_keys.add(key)
        self._put_into_eic(key)
        eic_key = KeyCodec(self.conn.conn_id, config.eic_kv_ns, self.conn.model_identity.token).encode(key)
        ours, error = SdkClient.connect(self.sdk, config)
        if ours is None:
            raise StepFailed(f"a second client could not connect: {error}", what_to_fix(self.config, error))
        theirs, error = SdkClient.connect(self.sdk, dataclasses.replace(config, eic_kv_ns=other_ns))
        if theirs is None:
            raise StepFailed(
                f"a client for namespace {other_ns!r} could not connect: {error}", what_to_fix(self.config, error)
            )
        seen_here = ours.mexist([eic_key])
        if seen_here.outcomes != [HIT]:
            raise StepFailed(
                f"the block is not visible through the SDK in its own namespace {config.eic_kv_ns!r}: "
                f"{seen_here.detail}",
                "the connector and the SDK disagree on the key or namespace; report it",
            )
        seen_there = theirs.mexist([eic_key])
        if seen_there.outcomes == [HIT]:
            raise StepFailed(
                f"a block written in namespace {config.eic_kv_ns!r} is visible from namespace {other_ns!r}",
                "this EIC does not separate namespaces: give each deployment its own "
                "AIBRIX_KV_CACHE_OL_L2_CACHE_NAMESPACE so their keys differ",
            )
        if seen_there.whole_call_failed:  # real clusters only know provisioned namespaces
            how = f"not visible there (that namespace does not answer: {seen_there.detail})"
        else:
            how = "a miss there"
        return PASS, f"namespace {config.eic_kv_ns!r} is isolated: the same EIC key asked for in {other_ns!r} is {how}"
