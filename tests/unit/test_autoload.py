"""The torch.backends entry point's own logic (hvd_torch_autoload), in this process:
it registers a lazy creator, leaves one that is already there, obeys its off switch,
logs instead of raising, reads the devices from the build record, and hvd_torch's
import replaces the lazy creator with the real one.
tests/integrations/test_backend_autoload.py runs it in fresh interpreters."""

import logging

import pytest
import torch.distributed as dist

import hvd_torch  # noqa: F401 - registers the real creator
import hvd_torch_autoload
from hvd_torch import _build_info
from hvd_torch import distributed as hvd_distributed


@pytest.fixture
def no_hvd_plugin(monkeypatch):
    """torch.distributed's registry without "hvd", restored afterwards."""
    monkeypatch.setattr(dist.Backend, "_plugins",
                        {k: v for k, v in dist.Backend._plugins.items() if k != "HVD"})
    monkeypatch.setattr(dist.Backend, "backend_capability", dict(dist.Backend.backend_capability))
    monkeypatch.delenv("HVD_TORCH_AUTOLOAD", raising=False)


def test_registers_a_lazy_creator_for_the_build_devices(no_hvd_plugin):
    hvd_torch_autoload.register()
    plugin = dist.Backend._plugins["HVD"]
    assert plugin.creator_fn is hvd_torch_autoload.create_backend and plugin.extended_api
    devices = ["cpu", "cuda"] if _build_info.cuda_built else ["cpu"]
    assert dist.Backend.backend_capability["hvd"] == devices


def test_leaves_a_registered_creator_alone():
    before = dist.Backend._plugins["HVD"]
    hvd_torch_autoload.register()
    assert dist.Backend._plugins["HVD"] is before
    assert before.creator_fn is hvd_distributed._create_backend


def test_off_switch(no_hvd_plugin, monkeypatch):
    monkeypatch.setenv("HVD_TORCH_AUTOLOAD", "0")
    hvd_torch_autoload.register()
    assert "HVD" not in dist.Backend._plugins


def test_a_failure_is_logged_not_raised(no_hvd_plugin, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("registry on fire")

    monkeypatch.setattr(dist.Backend, "register_backend", broken)
    with caplog.at_level(logging.WARNING, logger="hvd_torch_autoload"):
        hvd_torch_autoload.register()  # must not raise: it runs inside `import torch`
    assert "HVD" not in dist.Backend._plugins
    assert "could not register" in caplog.text and "registry on fire" in caplog.text


def test_hvd_torch_replaces_the_lazy_creator(no_hvd_plugin):
    hvd_torch_autoload.register()
    assert dist.Backend._plugins["HVD"].creator_fn is hvd_torch_autoload.create_backend
    hvd_distributed._register()  # what importing hvd_torch runs
    assert dist.Backend._plugins["HVD"].creator_fn is hvd_distributed._create_backend
