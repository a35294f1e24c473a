"""Starting ranks: the rendezvous store (store.py), the per-rank environment
(env.py) and the `hvdrun` launcher (launch.py).

Standard library only, and nothing is imported here, so the launcher and the Ray
driver can use these modules without loading torch or the compiled extension.
"""
