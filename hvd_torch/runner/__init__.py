"""`python -m hvd_torch.runner ...` runs hvdrun, for scripts written against the
launcher's old home. The launcher's modules are imported as `hvdrun.<module>`
only: it is a top-level package so that it starts without torch or the compiled
extension (importing anything under hvd_torch loads both).
"""
