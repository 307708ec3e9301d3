"""AIBrix's real L2Cache on the connector over a shared store, while a
process on the same node is frozen (SIGSTOP) inside a read. On f131f80 each
put hung its pool thread on the frozen reader's snapshot, the data pool
filled, gets timed out, the breaker opened and L2 was lost until the frozen
process resumed."""

import signal
import time

from engine_processes import frozen_process
from harness import L2Harness, tokens, use_config


def test_gets_keep_being_served_and_puts_fail_fast_while_a_peer_reader_is_frozen(monkeypatch, tmp_path, shared_dir):
    endpoint = f"l2?dir={shared_dir}&capacity=64MiB"
    # Direct puts on a small data pool: on f131f80 two stuck puts per thread fill it within seconds.
    use_config(monkeypatch, tmp_path, remote_url=f"local://{endpoint}", put_mode="direct", eic_thread_num=2)
    l2 = L2Harness()
    frozen = None
    try:
        query = tokens(8, seed=1)
        assert l2.put(query, l2.filled_blocks(seed=1, nblocks=8)).get() == 8
        frozen = frozen_process(endpoint, "read")
        puts, gets = [], []
        until = time.monotonic() + 10
        i = 0
        while time.monotonic() < until:
            started = time.monotonic()
            l2.put(tokens(2, seed=100 + i), l2.filled_blocks(seed=100 + i, nblocks=2))
            puts.append(time.monotonic() - started)
            started = time.monotonic()
            status, mrs = l2.get(query)
            gets.append(time.monotonic() - started)
            assert status.is_ok() and status.get() == 8, (i, status)
            assert all(l2.matches(mr, seed=1, block_index=b) for b, mr in enumerate(mrs))
            l2.release(mrs)
            i += 1
        assert not l2.connector._link.breaker.tripped
        assert max(gets) < 2.0, gets  # get_timeout_ms
        assert sorted(puts)[len(puts) // 2] < 0.5, puts  # a put fails fast once the frozen snapshot is known
        frozen.send_signal(signal.SIGCONT)
        frozen.communicate(timeout=60)
        started = time.monotonic()
        assert l2.put(tokens(2, seed=999), l2.filled_blocks(seed=999, nblocks=2)).get() == 2
        assert time.monotonic() - started < 2.0
    finally:
        if frozen is not None:
            frozen.send_signal(signal.SIGCONT)
            frozen.kill()
            frozen.stdout.close()
        l2.close()
