"""ProcessSet queries on every rank, on 2 and 3 ranks with a set of all ranks but
the last: size() answers everywhere, as Horovod's does (a set's size is global
knowledge: registration is a collective); rank() outside the set is a ValueError."""

import pytest
import torch

from dist_harness import attempt, launch_once


def _queries_main():
    """A set of all ranks but the last, asked about on every rank."""
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    n = hvd.size()
    sub = hvd.add_process_set(list(range(n - 1)))
    res = {"size": sub.size(), "included": sub.included(), "rank": attempt(sub.rank)[:2],
           "global_size": hvd.global_process_set.size()}
    hvd.remove_process_set(sub)
    res["removed_size"] = attempt(sub.size)[:2]
    hvd.shutdown()
    return res


@pytest.mark.parametrize("nranks", [2, 3])
def test_size_is_known_outside_the_set_rank_is_not(nranks):
    # As Horovod: a set's size is global knowledge (registration is a collective);
    # a rank outside the set has no rank in it.
    outsider = nranks - 1
    for rank, res in enumerate(launch_once(_queries_main, nranks, timeout=60)):
        assert res["size"] == nranks - 1, (rank, res)
        assert res["global_size"] == nranks
        assert res["included"] is (rank != outsider), (rank, res)
        exc_type, message = res["rank"]
        if rank == outsider:
            assert exc_type == "ValueError", res
            assert f"rank {rank} is not in process set" in message, res
        else:
            assert exc_type is None, (rank, res)
        exc_type, message = res["removed_size"]
        assert exc_type == "ValueError" and "is not registered" in message, res
