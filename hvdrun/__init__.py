"""hvdrun, the launcher: starting ranks here, over ssh, per node, or elastically.

  launch.py          the command line; hands the job to one of:
  static_launch.py   -np ranks over -H/--hostfile hosts (local or over ssh)
  node_launch.py     one hvdrun per node (Slurm, Kubernetes); slurm.py reads SLURM_*
  elastic_launch.py  the ElasticDriver (elastic_driver.py) with workers here or over ssh
  hosts.py, ssh.py, network.py, env.py   placement, remote starts, addresses, environment
  processes.py, supervise.py, output.py  running ranks, watching them, our messages
  store.py           the rendezvous store (the engine's C++ client talks to it)

Standard library only, and a top-level package rather than part of hvd_torch, so
that hvdrun starts without torch or the compiled extension: importing anything under
hvd_torch runs hvd_torch/__init__.py, which loads both.  Its modules are imported as
hvdrun.<module> only; `python -m hvd_torch.runner` (its old home) still runs it.
"""
