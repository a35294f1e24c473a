"""build_record.problems(): the build record against the running torch, as plain data.

A binary wheel pins torch==VERSION in its metadata, but a CPU torch and a CUDA torch
can satisfy one pin alike (2.14.1+cpu satisfies ==2.14.1), so the torch *build* is
compared too: a CPU wheel under a CUDA torch, or the reverse, is refused with both
builds named (issue #48). The import-time path (a subprocess, a planted record) is
tests/slow/test_install.py's.
"""

from hvd_torch import build_record

CPU_RECORD = {"torch_version": "2.13.0+cpu", "torch_cuda": None, "cuda_version": None,
              "cxx11_abi": True, "cuda_built": False, "nccl_built": False}
CUDA_RECORD = {"torch_version": "2.14.1", "torch_cuda": "13.0", "cuda_version": "13.0",
               "cxx11_abi": True, "cuda_built": True, "nccl_built": True}


def running(version, cuda):
    return {"torch_version": version, "cuda_version": cuda, "cxx11_abi": True}


def test_the_torch_it_was_built_for_is_no_problem():
    assert build_record.problems(CPU_RECORD, running("2.13.0+cpu", None)) == []
    assert build_record.problems(CUDA_RECORD, running("2.14.1", "13.0")) == []


def test_a_cuda_wheel_under_a_cpu_torch_of_the_same_release_names_both_builds():
    found = build_record.problems(CUDA_RECORD, running("2.14.1+cpu", None))
    assert found == [
        "torch version: built with 2.14.1, running 2.14.1+cpu",
        "torch build: built against torch 2.14.1 (a CUDA 13.0 build), "
        "running torch 2.14.1+cpu (a CPU build)",
    ]


def test_a_cpu_wheel_under_a_cuda_torch_names_both_builds_even_when_versions_agree():
    # Both report 2.14.1 (a CPU build installed from PyPI's plain version string, as
    # some indexes name it): only the build tells them apart.
    record = dict(CPU_RECORD, torch_version="2.14.1")
    found = build_record.problems(record, running("2.14.1", "13.0"))
    assert found == ["torch build: built against torch 2.14.1 (a CPU build), "
                     "running torch 2.14.1 (a CUDA 13.0 build)"]


def test_a_cuda_torch_without_nvcc_built_a_cpu_extension_for_that_cuda_torch():
    # cuda_built False (no CUDA source compiled), yet linked to the CUDA torch's
    # libraries: it runs with that torch, and is refused under a CPU one.
    record = dict(CPU_RECORD, torch_version="2.14.1", torch_cuda="13.0")
    assert build_record.problems(record, running("2.14.1", "13.0")) == []
    assert build_record.problems(record, running("2.14.1", None)) == [
        "torch build: built against torch 2.14.1 (a CUDA 13.0 build), "
        "running torch 2.14.1 (a CPU build)"]


def test_a_cuda_version_change_is_a_build_change():
    found = build_record.problems(CUDA_RECORD, running("2.14.1", "12.8"))
    assert found == ["torch build: built against torch 2.14.1 (a CUDA 13.0 build), "
                     "running torch 2.14.1 (a CUDA 12.8 build)"]


def test_a_record_from_before_torch_cuda_still_compares_what_it_knew():
    old = {k: v for k, v in CUDA_RECORD.items() if k != "torch_cuda"}
    assert build_record.problems(old, running("2.14.1", None)) == [
        "CUDA version: built with 13.0, running torch's None"]
    old_cpu = {k: v for k, v in CPU_RECORD.items() if k != "torch_cuda"}
    assert build_record.problems(old_cpu, running("2.13.0+cpu", None)) == []


def test_torch_build_in_words():
    assert build_record.torch_build(CPU_RECORD) == "torch 2.13.0+cpu (a CPU build)"
    assert build_record.torch_build(CUDA_RECORD) == "torch 2.14.1 (a CUDA 13.0 build)"
    assert build_record.torch_build(running("2.14.1", "13.0")) == \
        "torch 2.14.1 (a CUDA 13.0 build)"
