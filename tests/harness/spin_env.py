"""Rank environments for the tests of the callers' and the fast lane's waits.

SPIN turns spinning and the lane on even with more ranks than cores (where the
engine thread's spin and the lane are off by default: csrc/core/topology.cc),
so that 3 ranks on 2 cores take the same paths as 2.

PATIENT is for the tests that count lane ops alongside other tests: with more
busy ranks than cores, peers are rarely all running within 100 us, so an
arrival waits up to 20 ms (yielding its core to them) before it gives up.
"""

SPIN = {"HVD_TORCH_CALLER_SPIN_US": "100", "HVD_TORCH_ENGINE_SPIN_US": "100",
        "HVD_TORCH_FAST_LANE": "1"}
PATIENT = {**SPIN, "HVD_TORCH_CALLER_SPIN_US": "20000"}
