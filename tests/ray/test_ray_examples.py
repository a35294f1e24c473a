"""The seed's two flows as scripts, examples/ray_stateless.py and
examples/ray_stateful.py, and the elastic one, examples/ray_elastic.py,
joining this module's Ray with --address."""

import re

import pytest
from ray_harness import no_leaks, ray_address, ray_module_fixture, run_example  # noqa: F401

# The shape of test_ray_executor (its GPU tests): one Ray serves both.
RAY_SHAPE = dict(num_cpus=4, num_gpus=4)
ray_session = ray_module_fixture(**RAY_SHAPE)
pytestmark = [pytest.mark.usefixtures("ray_session", "no_leaks"), pytest.mark.timeout(240)]


def test_stateless_example():
    out = run_example("ray_stateless.py", "--address", ray_address(), "--num-workers", "3")
    assert "ranks [0, 1, 2] from 3 workers" in out


def test_stateful_example():
    out = run_example("ray_stateful.py", "--address", ray_address(), "--steps", "5")
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert [s.split(":")[0] for s in steps] == [f"step {i}/5" for i in range(1, 6)]
    losses = [float(s.rsplit(" ", 1)[1]) for s in steps]
    assert losses[-1] < losses[0]
    assert "all 2 workers hold identical weights after 5 steps" in out


def test_elastic_example_survives_a_killed_worker():
    out = run_example(
        "ray_elastic.py", "--address", ray_address(), "--epochs", "3", "--kill-at-epoch", "0"
    )
    assert "worker w1 (rank 0) dies after epoch 0" in out, out
    epochs = [int(line.split(":")[0][6:]) for line in out.splitlines() if line.startswith("epoch ")]
    # An epoch reports twice if the kill lands between its report and its commit.
    assert epochs == sorted(epochs) and set(epochs) == {0, 1, 2}, out
    # One reset when the replacement joins the round that drops w1; two when
    # the survivors go on as 2 first and the replacement joins the next round.
    assert re.search(r"all 3 workers hold identical weights after 3 epochs \([12] reset\(s\)\)",
                     out), out
