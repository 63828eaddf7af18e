"""The worker's view of its lease (gpulayer/worker/lease.py), on a fake clock."""

import asyncio

from gpulayer.worker.lease import Lease

from ..support import Clock


def test_a_late_answer_to_an_old_heartbeat_does_not_end_a_lapse() -> None:
    """A heartbeat sent as the network went down and answered once it came back
    renewed a lease that had already run out. Taking that answer ended the lapse,
    and the next check found the lease lapsed again: a task started in between
    was stopped at once and its job lost (tests/hosts/test_partitions.py)."""
    clock = Clock()
    lease = Lease(heartbeat_seconds=0.5, lease_seconds=5.0, clock=clock)

    async def run() -> None:
        lease.renewed(clock.now)  # stop_at = t + 4
        sent = clock.now + 0.5  # the heartbeat in flight when the network went down
        clock.now += 4.1
        await asyncio.wait_for(lease.lapse(), 1)
        assert lease.lapsed and lease.overdue()
        clock.now += 9.0  # the network comes back: the old heartbeat is answered now
        waiting = asyncio.ensure_future(lease.renewal())
        lease.renewed(sent)
        await asyncio.sleep(0)
        assert lease.lapsed and not waiting.done()  # still lapsed: register again
        lease.renewed(clock.now - 0.01)  # the registration's answer
        await asyncio.wait_for(waiting, 1)
        assert not lease.lapsed and not lease.overdue()

    asyncio.run(run())


def test_an_answer_in_time_renews_and_a_lapse_follows_silence() -> None:
    clock = Clock()
    lease = Lease(heartbeat_seconds=0.5, lease_seconds=5.0, clock=clock)

    async def run() -> None:
        lease.renewed(clock.now)
        clock.now += 3.0
        lease.renewed(clock.now - 0.1)  # answered in time: stop_at moves on
        assert lease.stop_at == clock.now - 0.1 + 4.0 and not lease.overdue()
        clock.now += 4.0
        await asyncio.wait_for(lease.lapse(), 1)
        assert lease.lapsed

    asyncio.run(run())
