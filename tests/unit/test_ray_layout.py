"""ray_integration's pure parts, without starting Ray: ranks from nodes, GPU
visibility, placement plans, settings and argument checks."""

import pytest

from ray_integration import RayExecutor, RaySettings
from ray_integration.placement import plan
from ray_integration.topology import assign_ranks, visible_devices


def _table(slots):
    return [
        (s.worker, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size, s.node_id)
        for s in slots
    ]


def test_one_node_ranks_follow_creation_order():
    assert _table(assign_ranks(["a", "a", "a"])) == [
        (0, 0, 0, 3, 0, 1, "a"),
        (1, 1, 1, 3, 0, 1, "a"),
        (2, 2, 2, 3, 0, 1, "a"),
    ]


def test_interleaved_nodes_get_consecutive_ranks():
    # PACK may put workers 0 and 2 on one node and 1 and 3 on another.
    assert _table(assign_ranks(["a", "b", "a", "b"])) == [
        (0, 0, 0, 2, 0, 2, "a"),
        (2, 1, 1, 2, 0, 2, "a"),
        (1, 2, 0, 2, 1, 2, "b"),
        (3, 3, 1, 2, 1, 2, "b"),
    ]


def test_uneven_nodes_count_every_node_in_cross_size():
    # The engine takes cross_size == 1 as "loopback only"; the lone worker on
    # b, and the second worker on a, must still see two nodes.
    assert _table(assign_ranks(["a", "a", "b"])) == [
        (0, 0, 0, 2, 0, 2, "a"),
        (1, 1, 1, 2, 0, 2, "a"),
        (2, 2, 0, 1, 1, 2, "b"),
    ]


def test_visible_devices_are_rays_ids_in_local_rank_order():
    slots = assign_ranks(["a", "b", "a", "b"])
    gpu_ids = [["3"], ["0"], ["1"], ["2"]]  # Ray's ids for workers 0..3
    devices = visible_devices(slots, gpu_ids)
    # Node a: ranks 0 (worker 0, GPU 3) and 1 (worker 2, GPU 1); node b likewise.
    assert devices == ["3,1", "3,1", "0,2", "0,2"]
    for slot, visible in zip(slots, devices):
        assert visible.split(",")[slot.local_rank] == gpu_ids[slot.worker][0]


def _device_hvd_uses(slot, visible):
    """What hvd_torch/gpu.py picks: local_rank % the visible count."""
    names = visible.split(",")
    return names[slot.local_rank % len(names)]


def test_workers_sharing_a_gpu_see_it_once_and_use_their_own():
    # gpus_per_worker=0.5: workers 0 and 1 share GPU 2, workers 2 and 3 GPU 0.
    gpu_ids = [["2"], ["2"], ["0"], ["0"]]
    slots = assign_ranks(["a", "a", "a", "a"])
    devices = visible_devices(slots, gpu_ids)
    assert devices == ["2,0", "0,2", "0,2", "2,0"]
    assert [_device_hvd_uses(s, d) for s, d in zip(slots, devices)] == ["2", "2", "0", "0"]


def test_three_workers_on_two_gpus_use_their_own():
    gpu_ids = [["5"], ["5"], ["7"]]  # Ray packed two on GPU 5, one on GPU 7
    slots = assign_ranks(["a", "a", "a"])
    devices = visible_devices(slots, gpu_ids)
    assert all(sorted(d.split(",")) == ["5", "7"] for d in devices)
    assert [_device_hvd_uses(s, d) for s, d in zip(slots, devices)] == ["5", "5", "7"]


def test_workers_with_two_gpus_find_theirs_from_local_rank():
    # gpus_per_worker=2 on nodes a and b.
    gpu_ids = [["0", "1"], ["4", "5"], ["2", "3"], ["6", "7"]]
    slots = assign_ranks(["a", "b", "a", "b"])
    devices = visible_devices(slots, gpu_ids)
    for slot, visible in zip(slots, devices):
        names = visible.split(",")
        at = slot.local_rank % len(names)
        assert names[at:at + 2] == gpu_ids[slot.worker]  # both of its own, in order
        node_gpus = {"a": ["0", "1", "2", "3"], "b": ["4", "5", "6", "7"]}[slot.node_id]
        assert sorted(names) == node_gpus


def test_plan_packs_one_bundle_per_worker():
    p = plan(3, None, 1, 2, 0)
    assert p.bundles == ({"CPU": 2},) * 3
    assert p.strategy == "PACK"
    assert p.worker_bundle == (0, 1, 2)
    assert p.worker_resources == {"CPU": 2}


def test_plan_spreads_one_bundle_per_host():
    p = plan(None, 2, 3, 1, 1)
    assert p.bundles == ({"CPU": 3, "GPU": 3},) * 2
    assert p.strategy == "STRICT_SPREAD"
    assert p.worker_bundle == (0, 0, 0, 1, 1, 1)
    assert p.worker_resources == {"CPU": 1, "GPU": 1}


@pytest.mark.parametrize(
    "args, match",
    [
        ((None, None, 1, 1, 0), "exactly one of num_workers"),
        ((2, 2, 1, 1, 0), "exactly one of num_workers"),
        ((0, None, 1, 1, 0), "num_workers must be a positive integer"),
        ((None, 2, 0, 1, 0), "num_workers_per_host must be a positive integer"),
        ((2, None, 1, 0, 0), "some CPUs or GPUs"),
    ],
)
def test_plan_rejects(args, match):
    with pytest.raises(ValueError, match=match):
        plan(*args)


def test_create_settings_uses_horovods_names():
    s = RayExecutor.create_settings(timeout_s=5, placement_group_timeout_s=7, verbose=0)
    assert s == RaySettings(timeout_s=5, placement_group_timeout_s=7, verbose=0)
    assert RayExecutor.create_settings(ssh_identity_file="~/.ssh/id").timeout_s == 30
    with pytest.raises(ValueError, match="nics"):
        RayExecutor.create_settings(nics={"eth0"})
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        RayExecutor.create_settings(timeout_s=0)


def test_executor_arguments():
    settings = RayExecutor.create_settings()
    assert RayExecutor(settings, num_workers=3).num_workers == 3
    assert RayExecutor(settings, num_hosts=2, num_workers_per_host=2).num_workers == 4
    # cpus_per_slot: Horovod's older name.
    ex = RayExecutor(settings, num_workers=2, cpus_per_slot=3)
    assert ex._plan.worker_resources == {"CPU": 3}
    gpu = RayExecutor(settings, num_workers=2, use_gpu=True)
    assert gpu._plan.worker_resources == {"CPU": 1, "GPU": 1}
    with pytest.raises(ValueError, match="use_gpu=True"):
        RayExecutor(settings, num_workers=2, gpus_per_worker=1)


def test_calls_before_start_say_so():
    ex = RayExecutor(RayExecutor.create_settings(), num_workers=2)
    for call in (
        lambda: ex.run(print),
        lambda: ex.execute(print),
        lambda: ex.execute_single(print),
    ):
        with pytest.raises(RuntimeError, match="not started"):
            call()
    ex.shutdown()  # nothing to release, and no error
